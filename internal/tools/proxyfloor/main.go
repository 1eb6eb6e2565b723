// Command proxyfloor is a bare net/http reverse proxy, the least any Go
// HTTP gateway adds to a request. Put it in front of the same route as
// hedgerow and run `hedgerow bench --compare-direct` against each, side by
// side: what the proxy adds is the floor on this machine at that moment,
// so hedgerow's added latency can be read against it on a noisy host.
//
//	go run ./internal/tools/proxyfloor --listen 127.0.0.1:8381 --to http://127.0.0.1:9301
package main

import (
	"errors"
	"flag"
	"fmt"
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

// newProxy forwards every request to the route at base URL to.
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
	return proxy, nil
}
