package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"orderpipe/shared/cli"
	"orderpipe/shared/config"
)

// probeCommand is `orderpipe probe [URL]`: an HTTP GET that exits 0 when the
// answer is 2xx. The container image has no curl or wget, so compose.yaml's
// healthchecks run this.
func probeCommand() cli.Command {
	var timeout time.Duration
	return cli.Command{
		Name:    "probe",
		Summary: "GET a health URL and exit 0 on a 2xx answer (the containers' healthcheck); default: this process's HTTP_ADDR /healthz",
		Usage:   "[--timeout 3s] [URL]",
		Env:     []string{config.EnvHTTPAddr},
		Setup: func(fs *flag.FlagSet) {
			fs.DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
		},
		Run: func(ctx context.Context, inv cli.Invocation) error {
			if len(inv.Args) > 1 {
				return cli.Usagef("want at most one URL")
			}
			if timeout <= 0 {
				return cli.Usagef("--timeout must be positive, got %s", timeout)
			}
			target := healthURL(inv.Config.HTTPAddr)
			if len(inv.Args) == 1 {
				target = inv.Args[0]
			}
			u, err := url.Parse(target)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return cli.Usagef("want an http(s) URL, got %q", target)
			}
			return probe(ctx, u.String(), timeout, inv.Stdout)
		},
	}
}

// healthURL is the /healthz URL of a server listening on addr, as seen from
// the same machine.
func healthURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/healthz"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/healthz"
}

func probe(ctx context.Context, target string, timeout time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", target, err)
	}
	// One request, no proxy, no connection kept open after it.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", target, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe %s: %s", target, resp.Status)
	}
	fmt.Fprintf(out, "%s: %s\n", target, resp.Status)
	return nil
}
