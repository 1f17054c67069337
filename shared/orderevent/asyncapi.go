package orderevent

import _ "embed" // the AsyncAPI document

//go:embed asyncapi.yaml
var asyncAPI []byte

// AsyncAPI returns the AsyncAPI 3.0 document (YAML) of the ORDERS stream:
// its channels, headers, payload schemas (JSON Schema 2020-12) and the
// delivery, ordering and versioning semantics. Tests hold it to this
// package's types; `orderpipe events asyncapi` prints it.
func AsyncAPI() []byte { return append([]byte(nil), asyncAPI...) }
