package natsauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
)

// region is one region's generated authorization with its gateway links,
// written into dir.
type region struct {
	name, dir string
	bundle    *Bundle
}

// generateRegion writes region name's users, TLS and gateway block, its
// gateway on listen dialing remote at remoteAddr; ca and password are the
// deployment's (nil: new ones, as for a first region).
func generateRegion(t *testing.T, name, listen, remote, remoteAddr string, ca *CA, password []byte) *region {
	t.Helper()
	s := spec()
	s.Region = name
	s.TLS = &TLSSpec{CA: ca}
	s.Gateway = &GatewaySpec{Listen: listen, Remotes: []GatewayRemote{{Name: remote, URLs: []string{remoteAddr}}}, Password: password}
	b, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	return &region{name: name, dir: dir, bundle: b}
}

// logLines keeps the lines a server logs as errors.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Errorf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}
func (l *logLines) Noticef(string, ...any) {}
func (l *logLines) Warnf(string, ...any)   {}
func (l *logLines) Fatalf(string, ...any)  {}
func (l *logLines) Debugf(string, ...any)  {}
func (l *logLines) Tracef(string, ...any)  {}

// has reports whether a logged error contains every one of words.
func (l *logLines) has(words ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			return true
		}
	}
	return false
}

// start runs r's server in process on a configuration that includes the
// generated authorization and gateway block, as a region's own file does.
func (r *region) start(t *testing.T) (*server.Server, *logLines) {
	t.Helper()
	conf := fmt.Sprintf("server_name: %s-1\nhost: 127.0.0.1\nport: -1\ninclude ./%s\ninclude ./%s\n", r.name, ServerConfigFile, GatewayConfigFile)
	path := filepath.Join(r.dir, "server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server cannot read %s's configuration: %v", r.name, err)
	}
	if opts.Gateway.TLSConfig == nil || opts.Gateway.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("%s's gateway does not require verified certificates: %+v", r.name, opts.Gateway.TLSConfig)
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logLines{}
	s.SetLogger(logs, false, false)
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("%s's nats-server not ready", r.name)
	}
	return s, logs
}

// inbound counts the server's inbound gateway links.
func inbound(t *testing.T, s *server.Server) int {
	t.Helper()
	gz, err := s.Gatewayz(&server.GatewayzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(gz.InboundGateways)
}

func linked(t *testing.T, a, b *server.Server) bool {
	return a.NumOutboundGateways() == 1 && b.NumOutboundGateways() == 1 && inbound(t, a) == 1 && inbound(t, b) == 1
}

func unlinked(t *testing.T, a, b *server.Server) {
	t.Helper()
	for _, s := range []*server.Server{a, b} {
		if out, in := s.NumOutboundGateways(), inbound(t, s); out != 0 || in != 0 {
			t.Fatalf("%s holds %d outbound and %d inbound gateway links, want none", s.Name(), out, in)
		}
	}
}

// TestGatewayLinksFormOnlyWithTheDeploymentsCAAndLinkPassword: two regions
// generated as an operator would — east first, west from east's directory
// (its CA and link password) — join as a supercluster over TLS and the
// link user. A west with another password, or with certificates of
// another CA, is refused by east (and refuses east), and a connection to
// east's gateway port without a client certificate fails its handshake.
func TestGatewayLinksFormOnlyWithTheDeploymentsCAAndLinkPassword(t *testing.T) {
	eastAddr, westAddr := natstest.FreeAddr(t), natstest.FreeAddr(t)
	east := generateRegion(t, "east", eastAddr, "west", westAddr, nil, nil)
	for _, f := range []string{GatewayConfigFile, GatewayPasswordFile, filepath.Join(TLSDir, CAKeyFile)} {
		if fi, err := os.Stat(filepath.Join(east.dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v, want 0600", f, err, fi.Mode())
		}
	}
	conf, err := os.ReadFile(filepath.Join(east.dir, ServerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(conf), string(east.bundle.Gateway.Password)) {
		t.Fatal("the users' configuration, which holds no secret, holds the link password")
	}
	ca, err := ReadCA(east.dir)
	if err != nil {
		t.Fatal(err)
	}
	password, err := ReadGatewayPassword(east.dir)
	if err != nil {
		t.Fatal(err)
	}
	eastNS, eastLog := east.start(t)

	// (a) A wrong password: each side refuses the other's link user.
	wrong := generateRegion(t, "west", westAddr, "east", eastAddr, ca, nil)
	wrongNS, wrongLog := wrong.start(t)
	t.Cleanup(func() {
		if t.Failed() {
			eastLog.mu.Lock()
			t.Logf("east's errors:\n%s", strings.Join(eastLog.lines, "\n"))
			eastLog.mu.Unlock()
		}
	})
	eventually.True(t, 20*time.Second, "east and the west of another password each refusing the other's link", func() bool {
		// Refusing west's link user, and refused by west.
		return eastLog.has("authentication error", GatewayUser) && eastLog.has("Gateway Error", "Authorization Violation") &&
			wrongLog.has("authentication error", GatewayUser)
	})
	unlinked(t, eastNS, wrongNS)
	wrongNS.Shutdown()
	wrongNS.WaitForShutdown()

	// (b) Certificates of another CA, the right password: TLS fails
	// before the link user is asked for.
	other := generateRegion(t, "west", westAddr, "east", eastAddr, nil, password)
	otherNS, otherLog := other.start(t)
	eventually.True(t, 20*time.Second, "east and the west of another CA each failing the other's TLS handshake", func() bool {
		return eastLog.has("TLS", "handshake error") && otherLog.has("TLS", "handshake error")
	})
	unlinked(t, eastNS, otherNS)
	otherNS.Shutdown()
	otherNS.WaitForShutdown()

	// (c) No client certificate: east's gateway port completes no
	// handshake with a connection that shows none.
	noCertificate(t, eastAddr, ca)

	// (d) West from east's directory: the link forms both ways.
	west := generateRegion(t, "west", westAddr, "east", eastAddr, ca, password)
	westNS, _ := west.start(t)
	eventually.True(t, 30*time.Second, "east and west linked both ways", func() bool { return linked(t, eastNS, westNS) })
}

// noCertificate dials addr's gateway port and starts TLS (a gateway's
// first bytes) trusting the CA but showing no certificate: the server must
// end the connection with an error, not wait for a CONNECT.
func noCertificate(t *testing.T, addr string, ca *CA) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	err = tc.Handshake()
	if err == nil {
		// TLS 1.3: the server's refusal of the certificate arrives after
		// the client's side of the handshake.
		_, err = tc.Read(make([]byte, 1))
	}
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a gateway connection without a client certificate: %v, want the server's refusal", err)
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a gateway connection without a client certificate failed with %v, want a certificate alert", err)
	}
}
