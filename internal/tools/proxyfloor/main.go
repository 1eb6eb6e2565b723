// Command proxyfloor is a bare net/http reverse proxy, the least any Go
// HTTP gateway adds to a request. Put it in front of the same route as
// hedgerow and run `hedgerow bench --compare-direct` against each, side by
// side: what the proxy adds is the floor on this machine at that moment,
// so hedgerow's added latency can be read against it on a noisy host.
//
//	go run ./internal/tools/proxyfloor --listen 127.0.0.1:8381 --to http://127.0.0.1:9301
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8381", "address to serve on")
	to := flag.String("to", "", "base URL of the route to forward every request to")
	flag.Parse()
	if err := run(*listen, *to); err != nil {
		fmt.Fprintln(os.Stderr, "proxyfloor:", err)
		os.Exit(1)
	}
}

func run(listen, to string) error {
	proxy, err := newProxy(to)
	if err != nil {
		return err
	}
	err = http.ListenAndServe(listen, proxy)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// maxBody bounds a request body the proxy reads, as hedgerow's
// http.body_limit does by default.
const maxBody = 4 << 20

// newProxy forwards every request to the route at base URL to. It reads
// each request body whole before forwarding it, as hedgerow's door does:
// forwarded as it arrives, a body whose route answers at once is closed by
// the HTTP/1 server when the answer starts, the transport's last read of
// it fails and takes the route's connection down mid-answer ("read error
// during body copy: use of closed network connection", golang/go#40747),
// which cut about one stream in a thousand from an instant fake.
func newProxy(to string) (http.Handler, error) {
	target, err := url.Parse(to)
	if err != nil || target.Scheme == "" || target.Host == "" {
		return nil, fmt.Errorf("--to %q: want a base URL such as http://127.0.0.1:9301", to)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	// The transport a hedgerow worker uses: the default, keeping up to 64
	// idle connections to the route, so both pay the same for connections.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64
	proxy.Transport = transport
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			http.Error(w, "proxyfloor: read the request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		proxy.ServeHTTP(w, r)
	}), nil
}
