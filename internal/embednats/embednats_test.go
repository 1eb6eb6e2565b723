package embednats

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testPayload = 1 << 20

// usersConfig writes a server configuration with one user "u" (password
// "p", allowed everything) and returns its path.
func usersConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats-server.conf")
	if err := os.WriteFile(path, []byte(`authorization { users = [ {user: "u", password: "p"} ] }`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func start(t *testing.T, cfg Options) *Server {
	t.Helper()
	s, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// roundTrip checks that a request on nc reaches a responder on responder.
func roundTrip(t *testing.T, responder, nc *nats.Conn) {
	t.Helper()
	sub, err := responder.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := responder.Flush(); err != nil {
		t.Fatal(err)
	}
	reply, err := nc.Request("echo", []byte("ping"), 5*time.Second)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if string(reply.Data) != "ping" {
		t.Fatalf("reply %q, want ping", reply.Data)
	}
}

func TestInProcessServerOpensNoPortAndConnectsThroughMemory(t *testing.T) {
	s := start(t, Options{MaxPayload: testPayload})
	if url := s.ClientURL(); url != "" {
		t.Fatalf("ClientURL = %q, want empty for an in-process server", url)
	}
	a, err := s.Connect("a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := s.Connect("b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	roundTrip(t, a, b)
}

func TestListeningServerAcceptsTCPClients(t *testing.T) {
	s := start(t, Options{Listen: "127.0.0.1:0", MaxPayload: testPayload, ConfigFile: usersConfig(t)})
	url := s.ClientURL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") || strings.HasSuffix(url, ":0") {
		t.Fatalf("ClientURL = %q, want a bound loopback address", url)
	}
	if nc, err := nats.Connect(url, nats.Name("anonymous")); err == nil {
		nc.Close()
		t.Fatal("an anonymous TCP client was let in")
	}
	tcp, err := nats.Connect(url, nats.Name("tcp"), nats.UserInfo("u", "p"))
	if err != nil {
		t.Fatalf("tcp connect: %v", err)
	}
	defer tcp.Close()
	mem, err := s.Connect("mem", nats.UserInfo("u", "p"))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	roundTrip(t, mem, tcp)
}

func TestServerAnnouncesTheConfiguredMaxPayload(t *testing.T) {
	for _, payload := range []int64{256 << 10, 8 << 20} {
		s := start(t, Options{MaxPayload: payload})
		nc, err := s.Connect("probe")
		if err != nil {
			t.Fatal(err)
		}
		if got := nc.MaxPayload(); got != payload || s.MaxPayload() != payload {
			t.Errorf("max payload: client sees %d, server reports %d, want %d", got, s.MaxPayload(), payload)
		}
		if err := nc.Publish("big", make([]byte, payload+1)); !errors.Is(err, nats.ErrMaxPayload) {
			t.Errorf("publishing %d bytes: %v, want ErrMaxPayload", payload+1, err)
		}
		nc.Close()
		s.Shutdown()
	}
}

func TestStartRefusesBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Options
	}{
		{"zero max payload", Options{}},
		{"max payload beyond the server's ceiling", Options{MaxPayload: 65 << 20}},
		{"listen without a port", Options{Listen: "127.0.0.1", MaxPayload: testPayload}},
		{"listen with a bad port", Options{Listen: "127.0.0.1:http", MaxPayload: testPayload}},
		{"listen without users", Options{Listen: "127.0.0.1:0", MaxPayload: testPayload}},
		{"config file that is not there", Options{MaxPayload: testPayload, ConfigFile: "/nonexistent/nats-server.conf"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Start(tt.cfg); !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("Start: %v, want ErrInvalidOptions", err)
			}
		})
	}
}

func TestStartReportsAnAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = Start(Options{Listen: ln.Addr().String(), MaxPayload: testPayload, ConfigFile: usersConfig(t)})
	if err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("Start on a busy address: %v, want a listen error", err)
	}
}

func TestListenWithoutUsersIsRefusedNamingTheFix(t *testing.T) {
	_, err := Start(Options{Listen: "127.0.0.1:0", MaxPayload: testPayload})
	if !errors.Is(err, ErrOpenListener) {
		t.Fatalf("Start: %v, want ErrOpenListener", err)
	}
}

func TestShutdownIsIdempotent(t *testing.T) {
	s, err := Start(Options{MaxPayload: testPayload})
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	s.Shutdown()
}

func TestJetStreamFsyncsEveryWriteUnlessAnIntervalIsGiven(t *testing.T) {
	for _, tt := range []struct {
		name         string
		syncInterval time.Duration
		wantAlways   bool
		wantInterval time.Duration
	}{
		{"the zero interval fsyncs every write before its ack", 0, true, 0},
		{"an interval fsyncs on a timer", 2 * time.Minute, false, 2 * time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := start(t, Options{MaxPayload: testPayload, StoreDir: t.TempDir(), SyncInterval: tt.syncInterval})
			js := s.ns.JetStreamConfig()
			if js == nil {
				t.Fatal("JetStream is not running")
			}
			if js.SyncAlways != tt.wantAlways || (tt.wantInterval != 0 && js.SyncInterval != tt.wantInterval) {
				t.Errorf("sync always %v, interval %v; want always %v, interval %v", js.SyncAlways, js.SyncInterval, tt.wantAlways, tt.wantInterval)
			}
		})
	}
}
