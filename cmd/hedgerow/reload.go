package main

import (
	"context"
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
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = p.Reload(load) // logged and counted by p; the running configuration stays on error
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		cancel()
		<-done
	}
}
