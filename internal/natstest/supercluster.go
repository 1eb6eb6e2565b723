package natstest

import (
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/tools/faultproxy"
)

// linkedTimeout bounds the wait for a supercluster's gateway links and its
// JetStream meta leader.
const linkedTimeout = 20 * time.Second

// Region is one region of a Supercluster: a one-server NATS cluster with
// JetStream, named for the region, whose gateway the other regions reach
// only through Link, a fault proxy (docs/architecture.md §14).
type Region struct {
	Name   string
	Server *server.Server
	Link   *faultproxy.Proxy
}

// Supercluster starts one region per name, each a one-server cluster of
// that name with JetStream in a TempDir, joined by gateway links that pass
// through each region's fault proxy: a server's gateway listens on a free
// address and advertises its proxy, so no region learns another's address
// but the proxy's, and partitioning every proxy (Cut) cuts every link both
// ways. Servers ping their gateways every second and drop a link after two
// unanswered pings, so a cut link is noticed within seconds rather than a
// minute. opts apply to every server. It returns once every link is up and
// every server follows one JetStream meta leader.
func Supercluster(t testing.TB, names []string, opts ...Option) []*Region {
	t.Helper()
	regions := make([]*Region, len(names))
	listen := make([]string, len(names))
	for i, name := range names {
		listen[i] = FreeAddr(t)
		p, err := faultproxy.Listen("127.0.0.1:0", listen[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		regions[i] = &Region{Name: name, Link: p}
	}
	for i, r := range regions {
		var remotes []*server.RemoteGatewayOpts
		for _, o := range regions {
			if o != r {
				remotes = append(remotes, &server.RemoteGatewayOpts{Name: o.Name,
					URLs: []*url.URL{{Scheme: "nats", Host: o.Link.Addr().String()}}})
			}
		}
		_, port, _ := net.SplitHostPort(listen[i])
		behind := func(o *server.Options) {
			o.Gateway.Port, _ = strconv.Atoi(port)
			o.Gateway.Advertise = r.Link.Addr().String()
			o.PingInterval, o.MaxPingsOut = time.Second, 2
		}
		all := append([]Option{Name(r.Name + "-1"), JetStream(t.TempDir()), Gateway(r.Name, remotes...), behind, AloneInCluster(t)}, opts...)
		r.Server = Start(t, all...)
	}
	eventually.True(t, linkedTimeout, "every region linked to every other both ways", func() bool {
		for _, r := range regions {
			if r.Server.NumOutboundGateways() != len(regions)-1 {
				return false
			}
		}
		return true
	})
	eventually.True(t, linkedTimeout, "a JetStream meta leader every server follows", func() bool {
		leader := false
		for _, r := range regions {
			leader = leader || r.Server.JetStreamIsLeader()
			if !r.Server.JetStreamIsCurrent() {
				return false
			}
		}
		return leader
	})
	return regions
}

// Cut partitions every region's link: nothing crosses between regions
// until Heal, as a network dropping packets.
func Cut(regions []*Region) {
	for _, r := range regions {
		r.Link.Partition()
	}
}

// Heal ends Cut.
func Heal(regions []*Region) {
	for _, r := range regions {
		r.Link.Heal()
	}
}
