package node

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/embednats"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// authBus is a NATS server (nats-server/v2 in process, on a loopback port)
// loading the authorization `hedgerow nats-auth` generates for two routes,
// with one worker user per route and one client user, alice.
type authBus struct {
	url string
	dir string // the generated files
}

func startAuthBus(t *testing.T, method natsauth.Method) *authBus {
	t.Helper()
	b, err := natsauth.Generate(natsauth.Spec{
		Method:    method,
		Routes:    []string{"fake-a", "fake-b"},
		Workers:   map[string][]string{"wa": {"fake-a"}, "wb": {"fake-b"}},
		Clients:   []string{"alice"},
		Responses: natsauth.ResponsesFor(5*time.Second, 50*time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	s, err := embednats.Start(embednats.Options{Listen: "127.0.0.1:0", MaxPayload: 8 << 20,
		ConfigFile: filepath.Join(dir, natsauth.ServerConfigFile), ServerName: "authbus"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return &authBus{url: s.ClientURL(), dir: dir}
}

// asyncErrors collects a connection's asynchronous errors (permission
// violations arrive this way).
type asyncErrors struct {
	mu   sync.Mutex
	errs []string
	ch   chan struct{}
}

func newAsyncErrors() *asyncErrors { return &asyncErrors{ch: make(chan struct{}, 1)} }

func (a *asyncErrors) option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		a.mu.Lock()
		a.errs = append(a.errs, err.Error())
		a.mu.Unlock()
		select {
		case a.ch <- struct{}{}:
		default:
		}
	})
}

func (a *asyncErrors) all() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.errs...)
}

// waitFor waits until an error naming subject arrives.
func (a *asyncErrors) waitFor(t *testing.T, subject string) {
	t.Helper()
	limit := time.NewTimer(wait)
	defer limit.Stop()
	for {
		for _, e := range a.all() {
			if strings.Contains(strings.ToLower(e), "permissions violation") && strings.Contains(e, `"`+subject+`"`) {
				return
			}
		}
		select {
		case <-a.ch:
		case <-limit.C:
			t.Fatalf("no permission error for %q within %v; async errors: %q", subject, wait, a.all())
		}
	}
}

// roleConfig is a role's configuration on the bus, authenticating as user.
func (b *authBus) roleConfig(t *testing.T, urlA, urlB, user string) *config.Config {
	t.Helper()
	cfg := parse(t, urlA, urlB, "")
	cfg.NATS.URLs = []string{b.url}
	cfg.NATS.NKeySeedFile = filepath.Join(b.dir, user+".nk")
	return cfg
}

// connect connects as role with cfg's credentials, recording async errors.
func connectAs(t *testing.T, cfg *config.Config, role config.Role, errs *asyncErrors) *nats.Conn {
	t.Helper()
	opts, err := ClientOptions(cfg.NATS, role, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := Connect(cfg.NATS.URLs, "test-"+string(role), nil, append(opts, errs.option())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// userConn connects as a generated user that hedgerow does not run
// (client, observer).
func (b *authBus) userConn(t *testing.T, user string, errs *asyncErrors, opts ...nats.Option) *nats.Conn {
	t.Helper()
	seed, err := nats.NkeyOptionFromSeed(filepath.Join(b.dir, user+".nk"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.url, append([]nats.Option{seed, errs.option()}, opts...)...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestEveryRoleDoesItsJobWithItsOwnCredentials(t *testing.T) {
	bus := startAuthBus(t, natsauth.MethodNKey)
	urlA, urlB := fakeRoute(t, 0), fakeRoute(t, 1)

	gwErrs, waErrs, wbErrs, clErrs := newAsyncErrors(), newAsyncErrors(), newAsyncErrors(), newAsyncErrors()
	gcfg := bus.roleConfig(t, urlA, urlB, "gateway")
	g, err := StartGateway(gcfg, connectAs(t, gcfg, config.RoleGateway, gwErrs), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, g)
	for _, w := range []struct {
		user, route string
		errs        *asyncErrors
	}{{"wa", "fake-a", waErrs}, {"wb", "fake-b", wbErrs}} {
		wcfg := bus.roleConfig(t, urlA, urlB, w.user)
		ws, err := StartWorkers(wcfg, connectAs(t, wcfg, config.RoleWorker, w.errs), Options{Routes: []string{w.route}})
		if err != nil {
			t.Fatal(err)
		}
		defer stop(t, ws)
	}

	// Readiness pings the workers' micro service: their answers are
	// responses they are allowed.
	if code, body := get(t, "http://"+g.Addr().String()+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	nc := bus.userConn(t, "alice", clErrs, nats.CustomInboxPrefix(schemas.ClientInbox("alice")))
	c, err := client.New(nc, client.WithTimeout(wait))
	if err != nil {
		t.Fatal(err)
	}
	req := client.Request{ModelClass: "general", Request: schemas.ChatRequest{
		Messages: []schemas.Message{{Role: "user", Content: schemas.TextContent("hi")}}}}
	resp, err := c.Submit(context.Background(), req)
	if err != nil {
		t.Fatalf("submit as alice: %v", err)
	}
	if resp.Content == "" || resp.FinishReason == "" {
		t.Fatalf("answer %+v, want content and a finish reason", resp)
	}
	st, err := c.Stream(context.Background(), req)
	if err != nil {
		t.Fatalf("stream as alice: %v", err)
	}
	chunks := 0
	for st.Next() {
		chunks++
	}
	if err := st.Err(); err != nil || st.Response() == nil || chunks == 0 {
		t.Fatalf("stream: %d chunks, response %v, err %v", chunks, st.Response(), err)
	}
	for name, e := range map[string]*asyncErrors{"gateway": gwErrs, "wa": waErrs, "wb": wbErrs, "alice": clErrs} {
		if got := e.all(); len(got) > 0 {
			t.Errorf("%s met errors doing its job: %q", name, got)
		}
	}
}

func TestEachRoleIsRefusedWhatItHasNoNeedFor(t *testing.T) {
	bus := startAuthBus(t, natsauth.MethodNKey)
	urlA, urlB := fakeRoute(t, 0), fakeRoute(t, 1)
	type try struct {
		name    string
		pub     bool // publish, else subscribe
		subject string
	}
	tests := []struct {
		user  string
		role  config.Role // "" for users hedgerow does not run
		tries []try
	}{
		{"wa", config.RoleWorker, []try{
			{"a worker cannot submit requests", true, schemas.SubmitSubject},
			{"a worker cannot publish attempts, even its own route's", true, "hedgerow.attempt.fake-a"},
			{"a worker cannot publish another route's attempts", true, "hedgerow.attempt.fake-b"},
			{"a worker cannot take another route's attempts", false, "hedgerow.attempt.fake-b"},
			{"a worker cannot read the gateways' reply inboxes", false, schemas.GatewayInboxPrefix + ".>"},
			{"a worker cannot answer an attempt it never received", true, schemas.GatewayInboxPrefix + ".x.1.1"},
			{"a worker cannot publish group records", true, "hedgerow.events.group"},
			{"a worker cannot forge kept records", true, "hedgerow.records.group.x"},
			{"a worker cannot cancel other workers' attempts", true, schemas.WorkerInboxPrefix + ".x"},
		}},
		{"gateway", config.RoleGateway, []try{
			{"a gateway cannot take attempts", false, "hedgerow.attempt.fake-a"},
			{"a gateway cannot submit requests", true, schemas.SubmitSubject},
			{"a gateway cannot read clients' inboxes", false, schemas.ClientInboxPrefix + ".>"},
		}},
		{"alice", "", []try{
			{"a client cannot read every inbox", false, "_INBOX.>"},
			{"a client cannot read the gateways' reply inboxes", false, schemas.GatewayInboxPrefix + ".>"},
			{"a client cannot read another client's inbox", false, schemas.ClientInbox("bob") + ".>"},
			{"a client cannot read attempts", false, "hedgerow.attempt.*"},
			{"a client cannot read the workers' control inboxes", false, schemas.WorkerInboxPrefix + ".>"},
			{"a client cannot publish attempts", true, "hedgerow.attempt.fake-a"},
			{"a client cannot forge replies", true, schemas.GatewayInboxPrefix + ".x.1.1"},
			{"a client cannot forge cancels", true, schemas.WorkerInboxPrefix + ".x"},
			{"a client cannot forge records", true, "hedgerow.events.group"},
			{"a client cannot forge kept records", true, "hedgerow.records.attempt.x.1"},
			{"a client cannot ping the workers", true, "$SRV.PING.hedgerow-worker"},
		}},
		{"observer", "", []try{
			{"an observer cannot publish records", true, "hedgerow.events.attempt"},
			{"an observer cannot forge kept records", true, "hedgerow.records.group.x"},
			{"an observer cannot delete the records stream", true, "$JS.API.STREAM.DELETE.hedgerow_records"},
			{"an observer cannot purge the records stream", true, "$JS.API.STREAM.PURGE.hedgerow_records"},
			{"an observer cannot submit", true, schemas.SubmitSubject},
			{"an observer cannot read inboxes", false, "_INBOX.>"},
		}},
	}
	for _, tt := range tests {
		for _, tr := range tt.tries {
			t.Run(tr.name, func(t *testing.T) {
				errs := newAsyncErrors()
				var nc *nats.Conn
				if tt.role != "" {
					cfg := bus.roleConfig(t, urlA, urlB, tt.user)
					nc = connectAs(t, cfg, tt.role, errs)
				} else {
					nc = bus.userConn(t, tt.user, errs, nats.CustomInboxPrefix(schemas.ClientInbox(tt.user)))
				}
				if tr.pub {
					if err := nc.Publish(tr.subject, []byte("{}")); err != nil {
						t.Fatal(err)
					}
				} else if _, err := nc.SubscribeSync(tr.subject); err != nil {
					t.Fatal(err)
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				errs.waitFor(t, tr.subject)
			})
		}
	}
}

func TestAConnectionWithoutValidCredentialsIsRefused(t *testing.T) {
	bus := startAuthBus(t, natsauth.MethodNKey)
	stranger, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := stranger.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opts []nats.Option
	}{
		{"anonymous", nil},
		{"a password user the server does not know", []nats.Option{nats.UserInfo("gateway", "guess")}},
		{"an nkey the server does not know", []nats.Option{nats.Nkey(pub, stranger.Sign)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := nats.Connect(bus.url, append(tt.opts, nats.MaxReconnects(0))...)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Fatalf("connect: %v, want an authorization error", err)
			}
		})
	}
}

func TestPasswordUsersAuthenticateWithThePasswordFromTheEnvironment(t *testing.T) {
	bus := startAuthBus(t, natsauth.MethodPassword)
	urlA, urlB := fakeRoute(t, 0), fakeRoute(t, 1)
	pw := readSecret(t, filepath.Join(bus.dir, "gateway.password"))
	cfg := parse(t, urlA, urlB, "")
	cfg.NATS.URLs, cfg.NATS.User, cfg.NATS.PasswordEnv = []string{bus.url}, "gateway", "TEST_NATS_PASSWORD"

	env := func(name string) (string, bool) {
		if name == "TEST_NATS_PASSWORD" {
			return pw, true
		}
		return "", false
	}
	opts, err := ClientOptions(cfg.NATS, config.RoleGateway, env)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := Connect(cfg.NATS.URLs, "pw", nil, opts...)
	if err != nil {
		t.Fatalf("connect with the generated password: %v", err)
	}
	nc.Close()

	_, err = ClientOptions(cfg.NATS, config.RoleGateway, func(string) (string, bool) { return "", false })
	if err == nil || !strings.Contains(err.Error(), "TEST_NATS_PASSWORD") {
		t.Fatalf("without the variable: %v, want an error naming TEST_NATS_PASSWORD", err)
	}
}

func readSecret(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func TestServeRefusesAListenerWithoutUsers(t *testing.T) {
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), "")
	cfg.NATS.Listen = "127.0.0.1:0"
	_, err := StartServe(cfg, Options{})
	if !errors.Is(err, config.ErrOpenListener) || !strings.Contains(err.Error(), "hedgerow nats-auth") {
		t.Fatalf("StartServe: %v, want ErrOpenListener naming the generator", err)
	}
}

func TestServeWithUsersServesAndLetsOnlyKnownUsersJoin(t *testing.T) {
	dir := t.TempDir()
	b, err := natsauth.Generate(natsauth.Spec{Routes: []string{"fake-a", "fake-b"}, Serve: true,
		Responses: natsauth.ResponsesFor(5*time.Second, 50*time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), "")
	cfg.NATS.Listen = "127.0.0.1:0"
	cfg.NATS.ServerConfig = filepath.Join(dir, natsauth.ServerConfigFile)
	cfg.NATS.NKeySeedFile = filepath.Join(dir, "serve.nk")
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	if code, body := postChat(t, "http://"+s.HTTPAddr().String()); code != http.StatusOK {
		t.Fatalf("chat through serve with users: %d %s", code, body)
	}
	if nc, err := nats.Connect(s.NATSURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("an anonymous client joined serve's listener")
	}
	errs := newAsyncErrors()
	obs, err := nats.NkeyOptionFromSeed(filepath.Join(dir, "observer.nk"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.NATSURL(), obs, errs.option())
	if err != nil {
		t.Fatalf("the observer user: %v", err)
	}
	defer nc.Close()
	if _, err := nc.SubscribeSync("hedgerow.events.group"); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil || len(errs.all()) > 0 {
		t.Fatalf("observer subscribing to records: %v %q", err, errs.all())
	}
	// The gateway kept the chat's group in the records stream, and the
	// observer reads it there with its read-only stream permissions.
	reader, err := nats.Connect(s.NATSURL(), obs, errs.option(), nats.CustomInboxPrefix(schemas.ObserverInboxPrefix))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if n := keptGroups(t, reader, "hedgerow_records"); n != 1 {
		t.Fatalf("the observer read %d kept group records, want 1 (errors %q)", n, errs.all())
	}
}

// keptGroups counts the group records the records stream keeps, read with
// an ordered consumer as an observer does.
func keptGroups(t *testing.T, nc *nats.Conn, stream string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Batches split, the latest record of each subject (docs/architecture.md §9).
	kept, err := records.Reader{JS: js, Stream: stream}.Kept(ctx, time.Time{})
	if err != nil {
		t.Fatalf("reading kept group records of %s: %v", stream, err)
	}
	n := 0
	for _, k := range kept {
		if !strings.HasPrefix(k.Subject, schemas.StoredRecordPrefix+"group.") {
			continue
		}
		var r schemas.GroupRecord
		if err := json.Unmarshal(k.Data, &r); err != nil || r.Outcome != schemas.GroupCommitted {
			t.Fatalf("kept group record %s: %v", k.Data, err)
		}
		n++
	}
	return n
}

// postChat posts a small chat completion to the HTTP door at base.
func postChat(t *testing.T, base string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return do(t, req)
}

func TestAWorkerWhoseUserMayNotTakeItsRouteRefusesToStart(t *testing.T) {
	bus := startAuthBus(t, natsauth.MethodNKey)
	urlA, urlB := fakeRoute(t, 0), fakeRoute(t, 1)
	cfg := bus.roleConfig(t, urlA, urlB, "wb") // wb may take fake-b only
	w, err := StartWorkers(cfg, connectAs(t, cfg, config.RoleWorker, newAsyncErrors()), Options{Routes: []string{"fake-a"}})
	if err == nil {
		stop(t, w)
		t.Fatal("a worker of fake-a started as a user of fake-b")
	}
	if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "hedgerow nats-auth") {
		t.Fatalf("StartWorkers: %v, want a permission violation naming the generator", err)
	}
}

func TestACallerThatGivesUpHasItsAttemptCancelledAcrossTheUsers(t *testing.T) {
	bus := startAuthBus(t, natsauth.MethodNKey)
	m, err := fakellm.InstantModel(5)
	if err != nil {
		t.Fatal(err)
	}
	m.TTFT.HangFraction = 1 // every request hangs until it is cancelled
	started, ended := make(chan struct{}, 4), make(chan fakellm.Record, 4)
	fake, err := fakellm.New(fakellm.Options{Model: m, Seed: 3,
		OnStart:  func() { started <- struct{}{} },
		OnRecord: func(r fakellm.Record) { ended <- r }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fake)
	t.Cleanup(func() { fake.Close(); srv.Close() })
	url := srv.URL + "/v1"

	gcfg := bus.roleConfig(t, url, url, "gateway")
	// A deadline far beyond the test's wait: only the cancel can end the
	// upstream request in time.
	gcfg.Policies[config.DefaultPolicy].Deadline = 50 * time.Second
	g, err := StartGateway(gcfg, connectAs(t, gcfg, config.RoleGateway, newAsyncErrors()), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, g)
	for _, w := range []struct{ user, route string }{{"wa", "fake-a"}, {"wb", "fake-b"}} {
		wcfg := bus.roleConfig(t, url, url, w.user)
		ws, err := StartWorkers(wcfg, connectAs(t, wcfg, config.RoleWorker, newAsyncErrors()), Options{Routes: []string{w.route}})
		if err != nil {
			t.Fatal(err)
		}
		defer stop(t, ws)
	}
	nc := bus.userConn(t, "alice", newAsyncErrors(), nats.CustomInboxPrefix(schemas.ClientInbox("alice")))
	// The client's timeout becomes the attempt's deadline: far too.
	c, err := client.New(nc, client.WithTimeout(50*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Submit(ctx, client.Request{ModelClass: "general", Request: schemas.ChatRequest{
			Messages: []schemas.Message{{Role: "user", Content: schemas.TextContent("hang")}}}})
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(wait):
		t.Fatal("the attempt never reached its route")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit: %v, want context.Canceled", err)
	}
	// The gateway's cancel reached the worker's control inbox, and the
	// worker cut the upstream request.
	select {
	case r := <-ended:
		if r.End != fakellm.EndDisconnected {
			t.Fatalf("route record %+v, want the upstream request disconnected", r)
		}
	case <-time.After(wait):
		t.Fatal("the hanging upstream request was never cancelled")
	}
}
