// Package natstest runs NATS servers inside the test process: each listens
// on a free loopback port (never 4222), logs nothing, handles no signals and
// is shut down, and waited for, by the test's cleanup. A server that does not
// start fails the test.
//
// It does not build on internal/embednats, the server `hedgerow serve`
// embeds: tests need the *server.Server itself (its client and route
// addresses, its route and interest counts, shutting one node of a cluster
// down) and clusters, which the production wrapper rightly hides.
package natstest

import (
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

// LeakOptions are what goleak must not count against a package whose tests
// ran servers: nats-server's setup of a stream source's consumer waits for
// its reply on a timer of its own (up to 30 s), not on the server's
// shutdown, so under load it outlives a test that sourced a stream
// (frontdoor/replay/actions) though the server is gone.
var LeakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
}

// readyTimeout bounds the wait for a server to accept connections.
const readyTimeout = 10 * time.Second

// Option changes the server's options before it starts.
type Option func(*server.Options)

// MaxPayload sets the largest message the server accepts, in bytes; without
// it the server keeps its default (1 MiB).
func MaxPayload(n int32) Option {
	return func(o *server.Options) { o.MaxPayload = n }
}

// Name sets the server's name, which its INFO and its cluster peers report.
func Name(name string) Option {
	return func(o *server.Options) { o.ServerName = name }
}

// JetStream enables JetStream with its store in dir (a test's TempDir):
// the file-backed streams and key-value buckets a real deployment keeps.
func JetStream(dir string) Option {
	return func(o *server.Options) { o.JetStream, o.StoreDir = true, dir }
}

// SyncAlways makes JetStream fsync every write before acknowledging it
// (nats-server's `sync_interval: always`), instead of its default timer.
func SyncAlways() Option {
	return func(o *server.Options) { o.SyncAlways = true }
}

// Cluster makes the server a node of the named cluster: it listens for
// routes on a free loopback port (see RouteURL) and routes to each of
// routes, the route URLs of nodes already running.
func Cluster(name string, routes ...*url.URL) Option {
	return func(o *server.Options) {
		o.Cluster = server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: server.RANDOM_PORT}
		o.Routes = routes
	}
}

// Gateway makes the server its cluster's gateway in a supercluster of
// clusters (nats-server's `gateway` block; each NATS cluster is one region):
// cluster names the server's cluster, which must match any Cluster option's,
// the server listens for gateway connections on a free loopback port (see
// GatewayURL) and connects to each of remotes, the other clusters by name
// and gateway URL. Servers of other clusters that connect to it are
// answered too, so one side of a pair may leave remotes empty.
func Gateway(cluster string, remotes ...*server.RemoteGatewayOpts) Option {
	return func(o *server.Options) {
		o.Gateway = server.GatewayOpts{Name: cluster, Host: "127.0.0.1", Port: server.RANDOM_PORT, Gateways: remotes}
		if o.Cluster.Name == "" {
			o.Cluster.Name = cluster
		}
	}
}

// AloneInCluster makes the server the one node of its cluster: clustered
// JetStream (which a Gateway option makes it) needs a configured route, so
// it routes to itself on a free address, which nats-server recognizes and
// drops.
func AloneInCluster(t testing.TB) Option {
	listen := FreeAddr(t)
	return func(o *server.Options) {
		_, port, _ := net.SplitHostPort(listen)
		o.Cluster.Host = "127.0.0.1"
		o.Cluster.Port, _ = strconv.Atoi(port)
		o.Routes = []*url.URL{{Scheme: "nats", Host: listen}}
	}
}

// FreeAddr is a loopback address that was free a moment ago: for a
// listener whose address must be known before its server starts (a
// gateway behind a proxy created first).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Start runs a NATS server configured by opts and returns once it accepts
// connections on its ClientURL. The test's cleanup shuts it down and waits
// until it has stopped; shutting it down earlier is fine.
func Start(t testing.TB, opts ...Option) *server.Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true}
	for _, opt := range opts {
		opt(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	s.Start()
	if !s.ReadyForConnections(readyTimeout) {
		t.Fatalf("natstest: server %s not ready for connections after %v", s.Name(), readyTimeout)
	}
	return s
}

// RouteURL is the URL other nodes of s's cluster route to; s must have been
// started with Cluster.
func RouteURL(s *server.Server) *url.URL {
	return &url.URL{Scheme: "nats", Host: s.ClusterAddr().String()}
}

// GatewayURL is the URL other clusters' gateways connect to; s must have
// been started with Gateway.
func GatewayURL(s *server.Server) *url.URL {
	return &url.URL{Scheme: "nats", Host: s.GatewayAddr().String()}
}

// Connect opens a connection to s over TCP with opts, closed by the test's
// cleanup (before s shuts down, when s was started first).
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("natstest: connect to %s: %v", s.ClientURL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}
