package node

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/internal/config"
)

// Listener is an address a process serves HTTP on, over TLS when CertFile
// and KeyFile are set (PEM).
type Listener struct {
	Addr              string
	CertFile, KeyFile string
}

// GatewayListeners are the listeners a gateway of cfg serves: http.listen
// (with http.tls) and http.internal_listen when set.
func GatewayListeners(cfg *config.Config) []Listener {
	out := []Listener{{Addr: cfg.HTTP.Listen, CertFile: cfg.HTTP.TLS.CertFile, KeyFile: cfg.HTTP.TLS.KeyFile}}
	if cfg.HTTP.InternalListen != "" {
		out = append(out, Listener{Addr: cfg.HTTP.InternalListen})
	}
	return out
}

// Waiting answers probes on a process's listeners while it waits at start
// (patience.go, httpdoor.NewWaiting): /healthz 200, /readyz 503 naming
// what it waits for. Stop frees the addresses for the process proper.
type Waiting struct {
	servers []*httpServer
	what    atomic.Value // string: what the process waits for now
}

// waitingStopTimeout bounds Stop: a probe in flight is answered or cut.
const waitingStopTimeout = time.Second

// ServeWaiting serves the waiting answers on each listener (none: nothing
// served, Stop does nothing); what is what the process waits for first.
func ServeWaiting(listeners []Listener, what string, log *slog.Logger) (*Waiting, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Waiting{}
	w.what.Store(what)
	h := httpdoor.NewWaiting(func() string { return w.what.Load().(string) })
	for _, l := range listeners {
		if l.Addr == "" {
			continue
		}
		s, err := serveHTTPTLS(l.Addr, 0, l.CertFile, l.KeyFile, &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}, log)
		if err != nil {
			return nil, errors.Join(err, w.Stop())
		}
		w.servers = append(w.servers, s)
		log.Info("waiting at start; answering probes", "probes", "http://"+s.Addr().String(), "waiting_for", what)
	}
	return w, nil
}

// Set says what the process waits for now.
func (w *Waiting) Set(what string) { w.what.Store(what) }

// Stop stops serving and frees the listeners' addresses.
func (w *Waiting) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), waitingStopTimeout)
	defer cancel()
	var errs []error
	for _, s := range w.servers {
		errs = append(errs, s.shutdown(ctx))
	}
	w.servers = nil
	return errors.Join(errs...)
}
