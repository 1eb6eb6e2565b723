// Package node assembles hedgerow's long-running processes from a loaded
// configuration (docs/architecture.md §2): the gateway (dispatcher behind the HTTP front
// door), the workers (one per route), `serve` (both around an embedded NATS
// server) and the simulator's fake LLM as an HTTP server. The commands in
// cmd/hedgerow only parse flags, call a Start function here, wait for a
// signal and call Stop.
//
// Every Start returns once the process serves — its listeners are bound,
// so Addr reports the real address even for port 0 — and every Stop is a
// graceful shutdown bounded by its context: stop accepting, let what runs
// finish, then release the connections. Failed reports a listener that
// died after Start; a process should treat it like a signal and Stop.
package node
