package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/hedgerow/hedgerow/internal/config"
)

// reloader is a process that takes over a reloaded configuration
// (node.Gateway, node.Serve); it logs and counts each reload itself.
type reloader interface {
	Reload(load func() (*config.Config, error)) error
}

// reloadOnHangup reloads p's configuration with load on every SIGHUP until
// ctx ends (docs/architecture.md §10, "Reloading"). SIGHUP is caught from
// the call on, so it never ends the process; the returned function stops
// catching it and waits for a reload under way.
func reloadOnHangup(ctx context.Context, p reloader, load func() (*config.Config, error)) (stop func()) {
	hup, stopCatching := catchHangups()
	stopHandling := onHangup(ctx, hup, func() {
		_ = p.Reload(load) // logged and counted by p; the running configuration stays on error
	})
	return func() {
		stopCatching()
		stopHandling()
	}
}

// catchHangups catches SIGHUP from the call on, so that it never ends the
// process (Go's default for it), into a channel that holds one; stop stops
// catching. A worker process calls it first thing: a SIGHUP during its
// start-up waits in the channel for ignoreHangups.
func catchHangups() (hup <-chan os.Signal, stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	return ch, func() { signal.Stop(ch) }
}

// ignoreHangups logs each SIGHUP from hup, and does nothing else, until ctx
// ends: a worker process does not reload (docs/architecture.md §10,
// "Reloading") — its routes name its NATS permissions and its provider
// keys come from its environment, which a signal cannot change — and its
// attempts in flight carry on. The returned function waits for the
// logging goroutine to end.
func ignoreHangups(ctx context.Context, hup <-chan os.Signal, log *slog.Logger, configPath string) (stop func()) {
	return onHangup(ctx, hup, func() {
		log.Warn("SIGHUP ignored: a worker does not reload its configuration; restart it (SIGTERM drains it first) to take a changed file",
			"config", configPath)
	})
}

// onHangup calls handle for each SIGHUP from hup, one at a time, until ctx
// ends or the returned function is called, which waits for a call under
// way.
func onHangup(ctx context.Context, hup <-chan os.Signal, handle func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				handle()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
