// Package config loads and validates hedgerow's YAML configuration (docs/architecture.md §10).
//
// Loading is strict: every key must be known, every value must have the right
// type and range, and every problem in a file is reported at once, each naming
// the file, the line and the field path, for example
//
//	local.yaml:14: policies.default.delay.quantile: 1.2 is outside (0,1)
//
// A file has seven top-level keys: nats, redis, http, routes, pools, policies
// and tenants. Durations are Go durations ("250ms", "30s"); byte sizes are
// integers or carry a binary suffix ("4MiB"). Keys a file leaves out take the
// values of the defaults table in defaults.go, the one place defaults are
// defined; a policy named "default" is added when the file has none, and
// applies to requests that name no operation class.
//
// Secrets never appear in the file: a route names the environment variable
// that holds its provider key (api_key_env), redis names the one that holds
// its password (password_env), and tenants list only SHA-256 hashes of their
// API keys. A variable is required only by the process roles that use it:
// workers (and serve, which runs workers) need the provider keys, gateways
// never do; every role that connects to Redis needs its password.
//
// deploy/examples/local.yaml is a commented example of every section.
package config
