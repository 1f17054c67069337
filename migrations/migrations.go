// Package migrations embeds orderpipe's SQL schema. Files are goose
// migrations named NNNNN_name.sql, each with an Up and a Down section;
// shared/postgres applies them.
package migrations

import "embed"

// FS holds every *.sql migration.
//
//go:embed *.sql
var FS embed.FS
