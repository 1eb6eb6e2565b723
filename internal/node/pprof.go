package node

import (
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
)

// pprofPrefix is where http.pprof serves Go's profiler on the internal
// listener.
const pprofPrefix = "/debug/pprof/"

// pprofWriteTimeout is the internal listener's write timeout with
// http.pprof: net/http/pprof refuses a CPU profile or an execution trace
// at least as long as its server's write timeout, and the listener's own
// (http.read_timeout, 10 s by default) would refuse pprof's default 30 s
// profile.
const pprofWriteTimeout = 2 * time.Minute

// internalHandler is the internal listener's handler: the generation's
// /readyz and /metrics (next), and with pprof Go's profiler under
// /debug/pprof/ (docs/architecture.md §9, "Profiling"). The profiler is
// mounted here only, never on the API listener, and not through
// http.DefaultServeMux (where importing net/http/pprof registers it):
// no hedgerow server serves that mux.
func internalHandler(next http.Handler, withPprof bool) http.Handler {
	if !withPprof {
		return next
	}
	prof := http.NewServeMux()
	prof.HandleFunc(pprofPrefix, pprof.Index) // the index, and each named profile (heap, goroutine, ...)
	prof.HandleFunc(pprofPrefix+"cmdline", pprof.Cmdline)
	prof.HandleFunc(pprofPrefix+"profile", pprof.Profile)
	prof.HandleFunc(pprofPrefix+"symbol", pprof.Symbol)
	prof.HandleFunc(pprofPrefix+"trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, pprofPrefix) {
			prof.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// internalWriteTimeout is the internal listener's write timeout:
// http.read_timeout, as for /readyz and /metrics, or with http.pprof
// long enough for a profile of up to pprofWriteTimeout less a second (none
// stays none).
func internalWriteTimeout(h config.HTTP) time.Duration {
	if h.Pprof && h.ReadTimeout > 0 {
		return max(h.ReadTimeout, pprofWriteTimeout)
	}
	return h.ReadTimeout
}
