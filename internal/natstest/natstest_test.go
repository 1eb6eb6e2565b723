package natstest

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/internal/eventually"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartListensOnALoopbackPortOtherThan4222(t *testing.T) {
	s := Start(t)
	url := s.ClientURL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") || strings.HasSuffix(url, ":4222") {
		t.Fatalf("client URL %s, want a free loopback port", url)
	}
	nc := Connect(t, s, nats.Name("test"))
	sub, err := nc.SubscribeSync("ping")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("ping", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("own message: %v", err)
	}
}

func TestMaxPayloadIsWhatClientsAreTold(t *testing.T) {
	nc := Connect(t, Start(t, MaxPayload(8<<20)))
	if got := nc.MaxPayload(); got != 8<<20 {
		t.Fatalf("max payload %d, want %d", got, 8<<20)
	}
}

func TestClusterNodesRouteToEachOther(t *testing.T) {
	a := Start(t, Name("a"), Cluster("natstest"))
	b := Start(t, Name("b"), Cluster("natstest", RouteURL(a)))
	eventually.True(t, 10*time.Second, "a and b routed to each other", func() bool {
		return a.NumRemotes() == 1 && b.NumRemotes() == 1
	})
	if b.Name() != "b" {
		t.Errorf("server name %q, want b", b.Name())
	}
}

func TestGatewaysJoinClustersAndCarryMessagesBetweenThem(t *testing.T) {
	east := Start(t, Name("east-1"), Gateway("east"))
	west := Start(t, Name("west-1"), Gateway("west", &server.RemoteGatewayOpts{Name: "east", URLs: []*url.URL{GatewayURL(east)}}))
	// Each side's outbound connection is the other's inbound one.
	eventually.True(t, 10*time.Second, "east and west connected both ways", func() bool {
		return east.NumOutboundGateways() == 1 && west.NumOutboundGateways() == 1
	})
	if west.ClusterName() != "west" {
		t.Errorf("cluster name %q, want the gateway's, west", west.ClusterName())
	}
	sub, err := Connect(t, east).SubscribeSync("across")
	if err != nil {
		t.Fatal(err)
	}
	nc := Connect(t, west)
	// Interest crosses the link shortly after the subscription: publish
	// until one arrives.
	eventually.True(t, 10*time.Second, "a message from west received in east", func() bool {
		if err := nc.Publish("across", []byte("x")); err != nil {
			t.Fatal(err)
		}
		_, err := sub.NextMsg(20 * time.Millisecond)
		return err == nil
	})
}
