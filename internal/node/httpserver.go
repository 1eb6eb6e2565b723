package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
)

// httpServer is an http.Server on a listener bound before it is returned,
// so its address is known and a bind failure is a Start error.
type httpServer struct {
	srv    *http.Server
	ln     net.Listener
	failed chan error    // at most one error: Serve ending on its own
	done   chan struct{} // closed when Serve has returned
}

// serveHTTP binds addr and serves srv on it in a goroutine.
func serveHTTP(addr string, srv *http.Server, log *slog.Logger) (*httpServer, error) {
	return serveHTTPLimited(addr, 0, srv, log)
}

// serveHTTPLimited is serveHTTP with at most maxConns connections open at
// once (0: no cap).
func serveHTTPLimited(addr string, maxConns int, srv *http.Server, log *slog.Logger) (*httpServer, error) {
	return serveHTTPTLS(addr, maxConns, "", "", srv, log)
}

// serveHTTPTLS is serveHTTPLimited over TLS with the certificate and key
// in certFile and keyFile (PEM), which are loaded before it returns; plain
// HTTP when both are empty.
func serveHTTPTLS(addr string, maxConns int, certFile, keyFile string, srv *http.Server, log *slog.Logger) (*httpServer, error) {
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("http: tls: %w", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http: listen %s: %w", addr, err)
	}
	if maxConns > 0 {
		ln = limitListener(ln, maxConns)
	}
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	s := &httpServer{srv: srv, ln: ln, failed: make(chan error, 1), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		serve := srv.Serve
		if srv.TLSConfig != nil {
			// The certificate is in TLSConfig already: no files named here.
			serve = func(ln net.Listener) error { return srv.ServeTLS(ln, "", "") }
		}
		if err := serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.failed <- fmt.Errorf("http: serve %s: %w", ln.Addr(), err)
		}
	}()
	return s, nil
}

// Addr is the bound address.
func (s *httpServer) Addr() net.Addr { return s.ln.Addr() }

// shutdown stops accepting and waits, bounded by ctx, for the requests in
// flight; on ctx's expiry it closes every connection and returns ctx's error.
func (s *httpServer) shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
		err = fmt.Errorf("http: shutdown %s: %w", s.ln.Addr(), err)
	}
	<-s.done
	return err
}
