// Package natsauth writes the NATS authorization of a hedgerow deployment
// (docs/architecture.md §13): one user per role, each with only the subjects
// its part of the wire (docs/architecture.md §8) needs, as a nats-server
// configuration, with each user's secret in a file of its own (mode 0600).
//
// The subjects come from schemas, the wire's one home (docs/architecture.md
// §8), never from copies. Each role's connections keep their inboxes under
// a prefix of their own (schemas.GatewayInboxPrefix, WorkerInboxPrefix,
// ClientInbox(user), ObserverInboxPrefix), so a role may subscribe to its
// own replies and to no one else's: a client cannot read _INBOX.> or an
// attempt subject.
package natsauth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/frontdoor/replay/actions"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker"
)

// Method is how users authenticate.
type Method string

// Methods.
const (
	// MethodNKey: each user is an nkey; its seed is written to <user>.nk
	// and the server holds only the public key.
	MethodNKey Method = "nkey"
	// MethodPassword: each user has a random password written to
	// <user>.password; the server holds only its bcrypt hash.
	MethodPassword Method = "password"
)

// Responses bound what a worker may publish on the reply subjects of the
// attempts it received (NATS allow_responses): Max messages each, for
// Expires after the attempt's delivery.
type Responses struct {
	Max     int
	Expires time.Duration
}

// Chunk rates a streamed attempt is assumed never to exceed, for
// ResponsesFor: the worker flushes a chunk at worker.DefaultCoalesceTokens
// tokens or after worker.DefaultCoalesceDelay (docs/architecture.md §8), so
// at most one chunk per delay plus one per coalesced batch of tokens at
// maxTokenRate tokens a second.
const (
	maxTokenRate = 5000 // tokens a second, far above any provider's stream
	// expiresMargin covers what follows the deadline: the provider's last
	// bytes, the result and the worker's clock skew.
	expiresMargin = 30 * time.Second
	// fixedReplies are the replies that do not scale with time: Accept,
	// Busy, FirstByte, the result, and a margin.
	fixedReplies = 16
)

// ResponsesFor is the allow_responses bound covering a streamed attempt of
// the longest deadline with heartbeats at heartbeat (the shortest
// interval of the policies; 0 means worker.DefaultHeartbeatInterval).
func ResponsesFor(deadline, heartbeat time.Duration) Responses {
	if heartbeat <= 0 {
		heartbeat = worker.DefaultHeartbeatInterval
	}
	expires := deadline + expiresMargin
	secs := expires.Seconds()
	perSecond := float64(time.Second)/float64(worker.DefaultCoalesceDelay) +
		float64(maxTokenRate)/float64(worker.DefaultCoalesceTokens) +
		float64(time.Second)/float64(heartbeat)
	return Responses{Max: int(math.Ceil(secs*perSecond)) + fixedReplies, Expires: expires}
}

// ResponsesForConfig is ResponsesFor the longest policy deadline of cfg and
// its shortest heartbeat interval (the one workers beat at).
func ResponsesForConfig(cfg *config.Config) Responses {
	var deadline, heartbeat time.Duration
	for _, p := range cfg.Policies {
		deadline = max(deadline, p.Deadline)
		if p.HeartbeatInterval > 0 && (heartbeat == 0 || p.HeartbeatInterval < heartbeat) {
			heartbeat = p.HeartbeatInterval
		}
	}
	return ResponsesFor(deadline, heartbeat)
}

// SpecForConfig is the users of the deployment cfg describes (`hedgerow
// nats-auth --config`): its routes, the workers' reply bound of its
// policies, its gate bucket, records stream and region and, with
// global.regions, the leases' bucket, which only gateways may use
// (docs/architecture.md §13, §14). One worker user of every route and one
// client, until the caller says otherwise.
func SpecForConfig(cfg *config.Config) Spec {
	spec := Spec{GateBucket: cfg.Gate.Bucket, RecordsStream: cfg.Records.Stream, Region: cfg.Deployment.Region,
		Responses: ResponsesForConfig(cfg)}
	if len(cfg.Global.Regions) > 0 {
		spec.LeasesBucket = cfg.Global.Authority.Bucket
	}
	for _, r := range cfg.Routes {
		spec.Routes = append(spec.Routes, r.Name)
	}
	return spec
}

// Spec describes the users to generate.
type Spec struct {
	// Method is how users authenticate; empty means MethodNKey.
	Method Method
	// Routes are every configured route: serve's workers and a worker
	// user with no routes of its own take them all.
	Routes []string
	// Serve also generates the serve user, a gateway's and a worker's
	// permissions of every route in one, which only `hedgerow serve` with
	// a NATS listener needs (docs/architecture.md §13); a deployment of
	// gateways and workers has no use for it, so it is not generated
	// unless asked for.
	Serve bool
	// Workers maps a worker user to the routes it serves; empty means one
	// user "worker" for every route.
	Workers map[string][]string
	// Clients are the users that may only submit requests; empty means one
	// user "client".
	Clients []string
	// Responses bound the workers' replies (ResponsesFor).
	Responses Responses
	// GateBucket is the winner gate's ledger bucket (gate.bucket) that
	// gateways read and write; empty means arbiter.DefaultLedgerBucket.
	GateBucket string
	// RecordsStream is the records stream (records.stream) gateways keep
	// and observers read; empty means records.DefaultStream.
	RecordsStream string
	// Region is the supercluster region whose servers take this
	// authorization (deployment.region): every subject, queue group and
	// service name in it is the region's (schemas.RegionWire), so the
	// region's users may touch no other region's wire. Empty: a
	// deployment of one region.
	Region string
	// LeasesBucket is the leases' bucket (global.authority.bucket) the
	// gateways renew the region's leases in (docs/architecture.md §14):
	// only the gateway (and serve) user may read or write it — a client
	// or worker that could would grant its region the whole of a global
	// ceiling. Empty: no user may (a deployment without global.regions).
	LeasesBucket string
	// TLS, when set, also generates a CA, the servers' certificate and a
	// client certificate per user (tls.go), and the server configuration
	// then requires TLS with a client certificate.
	TLS *TLSSpec
	// Gateway, when set, also writes the region's gateway block
	// (gateway.go): its links to the other regions' clusters, with TLS
	// (which it needs) and the link user's authorization.
	Gateway *GatewaySpec
}

// Role names of the generated users that are not per worker or client.
const (
	UserServe    = "serve"
	UserGateway  = "gateway"
	UserObserver = "observer"
	UserWorker   = "worker"
	UserClient   = "client"
)

// User is one generated user.
type User struct {
	// Name names the user and its secret file.
	Name string
	// Role is what it may do: serve, gateway, worker, client or observer.
	Role string
	// Routes are a worker's routes.
	Routes []string
	// Permissions are its subject permissions.
	Permissions Permissions
	// Public is the nkey's public key (MethodNKey) or the password's
	// bcrypt hash (MethodPassword): what the server holds.
	Public string
	// Secret is the nkey seed or the password: what the user holds.
	Secret []byte
	// SecretFile is the file name Write puts Secret in.
	SecretFile string
	// InboxPrefix is the prefix its connections must use.
	InboxPrefix string
}

// Permissions are a user's subject permissions; everything not allowed is
// denied.
type Permissions struct {
	Publish   []string
	Subscribe []string
	// Responses, when set, lets the user publish to the reply subjects of
	// messages it received, within the bound.
	Responses *Responses
}

// Bundle is a generated authorization: the users and the server
// configuration that holds their public halves.
type Bundle struct {
	Method Method
	Users  []User
	// TLS is the TLS material, when Spec.TLS asked for it.
	TLS *TLSBundle
	// Gateway is the region's gateway block, when Spec.Gateway asked for it.
	Gateway *GatewayLinks
}

// userName is what a user name must match: it becomes a file name and a
// subject token.
var userName = regexp.MustCompile(`^[a-z0-9_-]+$`)

// Generate draws a secret for each user of spec and gives each its
// permissions.
func Generate(spec Spec) (*Bundle, error) {
	method := spec.Method
	if method == "" {
		method = MethodNKey
	}
	if method != MethodNKey && method != MethodPassword {
		return nil, fmt.Errorf("natsauth: method %q: want nkey or password", method)
	}
	if len(spec.Routes) == 0 {
		return nil, errors.New("natsauth: no routes")
	}
	if spec.Responses.Max <= 0 || spec.Responses.Expires <= 0 {
		return nil, errors.New("natsauth: the workers' response bound must be positive")
	}
	workers := spec.Workers
	if len(workers) == 0 {
		workers = map[string][]string{UserWorker: spec.Routes}
	}
	clients := spec.Clients
	if len(clients) == 0 {
		clients = []string{UserClient}
	}
	resp := spec.Responses
	bucket := spec.GateBucket
	if bucket == "" {
		bucket = arbiter.DefaultLedgerBucket
	}
	stream := spec.RecordsStream
	if stream == "" {
		stream = records.DefaultStream
	}
	if spec.Region != "" && !userName.MatchString(spec.Region) {
		return nil, fmt.Errorf("natsauth: region %q is not a token of [a-z0-9_-]", spec.Region)
	}
	wire := schemas.RegionWire(spec.Region)
	gateway := gatewayPermissions(wire, bucket, stream, spec.LeasesBucket)
	var users []User
	if spec.Serve {
		users = append(users, User{Name: UserServe, Role: UserServe, Routes: spec.Routes, InboxPrefix: schemas.GatewayInboxPrefix,
			Permissions: union(gateway, workerPermissions(wire, spec.Routes, resp))})
	}
	users = append(users,
		User{Name: UserGateway, Role: UserGateway, InboxPrefix: schemas.GatewayInboxPrefix, Permissions: gateway},
		User{Name: UserObserver, Role: UserObserver, InboxPrefix: schemas.ObserverInboxPrefix, Permissions: observerPermissions(wire, stream)},
	)
	for _, name := range slices.Sorted(maps.Keys(workers)) {
		routes := workers[name]
		for _, r := range routes {
			if !slices.Contains(spec.Routes, r) {
				return nil, fmt.Errorf("natsauth: worker user %q: no route is named %q", name, r)
			}
		}
		if len(routes) == 0 {
			return nil, fmt.Errorf("natsauth: worker user %q has no routes", name)
		}
		users = append(users, User{Name: name, Role: UserWorker, Routes: slices.Clone(routes),
			InboxPrefix: schemas.WorkerInboxPrefix, Permissions: workerPermissions(wire, routes, resp)})
	}
	for _, name := range clients {
		users = append(users, User{Name: name, Role: UserClient, InboxPrefix: schemas.ClientInbox(name),
			Permissions: clientPermissions(wire, name)})
	}
	seen := map[string]bool{}
	for i := range users {
		u := &users[i]
		if !userName.MatchString(u.Name) {
			return nil, fmt.Errorf("natsauth: user name %q is not a token of [a-z0-9_-]", u.Name)
		}
		if seen[u.Name] {
			return nil, fmt.Errorf("natsauth: user name %q is used twice", u.Name)
		}
		seen[u.Name] = true
		if err := u.drawSecret(method); err != nil {
			return nil, err
		}
	}
	b := &Bundle{Method: method, Users: users}
	if spec.Gateway != nil {
		if spec.TLS == nil {
			return nil, errors.New("natsauth: gateway links need TLS")
		}
		g, err := newGatewayLinks(*spec.Gateway, spec.Region)
		if err != nil {
			return nil, err
		}
		b.Gateway = g
	}
	if spec.TLS != nil {
		names := make([]string, len(users))
		for i, u := range users {
			names[i] = u.Name
		}
		t, err := GenerateTLS(*spec.TLS, names, time.Now())
		if err != nil {
			return nil, err
		}
		b.TLS = t
	}
	return b, nil
}

// passwordBytes is the entropy of a generated password.
const passwordBytes = 24

func (u *User) drawSecret(method Method) error {
	switch method {
	case MethodNKey:
		kp, err := nkeys.CreateUser()
		if err != nil {
			return fmt.Errorf("natsauth: user %s: %w", u.Name, err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return fmt.Errorf("natsauth: user %s: %w", u.Name, err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return fmt.Errorf("natsauth: user %s: %w", u.Name, err)
		}
		u.Public, u.Secret, u.SecretFile = pub, seed, u.Name+".nk"
	default:
		raw := make([]byte, passwordBytes)
		if _, err := rand.Read(raw); err != nil {
			return fmt.Errorf("natsauth: user %s: %w", u.Name, err)
		}
		pw := []byte(fmt.Sprintf("%x", raw))
		// The cost guards guessable passwords; one of passwordBytes random
		// bytes is out of any search's reach at the lowest cost, and the
		// server pays that cost on every connect.
		hash, err := bcrypt.GenerateFromPassword(pw, bcrypt.MinCost)
		if err != nil {
			return fmt.Errorf("natsauth: user %s: %w", u.Name, err)
		}
		u.Public, u.Secret, u.SecretFile = string(hash), pw, u.Name+".password"
	}
	return nil
}

// srvVerbs are the verbs a micro service answers (micro.AddService
// subscribes to each).
var srvVerbs = []micro.Verb{micro.PingVerb, micro.InfoVerb, micro.StatsVerb}

// srvSubjects are the micro-service control subjects a service of name
// subscribes to, and no others (docs/architecture.md §13): for each verb
// $SRV.<verb> (which micro.AddService always subscribes to), $SRV.<verb>.<name>
// and $SRV.<verb>.<name>.<id> (the id is drawn at start). No wildcard stands
// for the verb or the name, so a user can never take another service's
// pings.
func srvSubjects(name string) []string {
	var out []string
	for _, v := range srvVerbs {
		verb := micro.APIPrefix + "." + v.String()
		out = append(out, verb, verb+"."+name, verb+"."+name+".*")
	}
	return out
}

// queueSubscription is a subscribe permission that allows subject only
// in queue group queue (nats-server's "<subject> <queue>" entries): a plain
// subscription to subject, or one in another group, is refused.
func queueSubscription(subject, queue string) string { return subject + " " + queue }

// bucketPermissions are what a user of a key-value bucket publishes:
// create or update it, read and write its keys.
func bucketPermissions(bucket string) []string {
	stream := "KV_" + bucket
	return []string{
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.STREAM.CREATE." + stream,
		"$JS.API.STREAM.UPDATE." + stream,
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.DIRECT.GET." + stream + ".>",
		"$KV." + bucket + ".>",
	}
}

// actionsPermissions are what a gateway of a region publishes to the index
// of committed user actions (docs/architecture.md §14): create or update
// the region's actions stream and its copy of the others', publish the
// region's entries and heartbeats, and read the copy by direct gets. No
// other user may: one that could publish entries would forge commits, and
// refuse or replay other callers' user actions in other regions.
func actionsPermissions(wire schemas.Wire) []string {
	var out []string
	for _, stream := range []string{wire.JetStreamName(actions.StreamName), wire.JetStreamName(actions.SeenStreamName)} {
		out = append(out, "$JS.API.STREAM.INFO."+stream, "$JS.API.STREAM.CREATE."+stream, "$JS.API.STREAM.UPDATE."+stream)
	}
	seen := wire.JetStreamName(actions.SeenStreamName)
	return append(out, "$JS.API.DIRECT.GET."+seen, "$JS.API.DIRECT.GET."+seen+".>", wire.ActionPrefix()+">")
}

// gatewayPermissions: publish the region's attempts (to every route),
// cancels (to the workers' control inboxes), records, answers to clients
// and readiness pings of the region's workers; use the winner gate's
// ledger bucket and, with regions, the leases' bucket (create it, read and
// write its keys) and the records stream (create or update it, publish to
// it, read it back with ordered consumers for the report endpoints) and
// nothing else of JetStream; subscribe to its own inboxes and to the
// region's submit service.
func gatewayPermissions(wire schemas.Wire, gateBucket, recordsStream, leasesBucket string) Permissions {
	publish := append([]string{"$JS.API.INFO"}, bucketPermissions(gateBucket)...)
	if leasesBucket != "" {
		publish = append(publish, bucketPermissions(leasesBucket)...)
		publish = append(publish, actionsPermissions(wire)...)
	}
	return Permissions{
		Publish: append(publish,
			"$JS.API.STREAM.INFO."+recordsStream,
			"$JS.API.STREAM.CREATE."+recordsStream,
			"$JS.API.STREAM.UPDATE."+recordsStream,
			// Its report endpoints read the records back (observer's read API).
			"$JS.API.CONSUMER.CREATE."+recordsStream,
			"$JS.API.CONSUMER.CREATE."+recordsStream+".>",
			"$JS.API.CONSUMER.INFO."+recordsStream+".>",
			"$JS.API.CONSUMER.DELETE."+recordsStream+".>",
			"$JS.API.CONSUMER.MSG.NEXT."+recordsStream+".>",
			wire.StoredRecordPrefix()+">",
			wire.AttemptSubjectPrefix()+"*",
			schemas.WorkerInboxPrefix+".>",
			wire.AttemptRecordSubject(),
			wire.GroupRecordSubject(),
			schemas.ClientInboxPrefix+".>",
			micro.APIPrefix+".PING."+wire.WorkerServiceName(),
		),
		Subscribe: append([]string{
			schemas.GatewayInboxPrefix + ".>",
			wire.SubmitSubject(),
			wire.SubmitCancelPrefix() + ">",
		}, srvSubjects(wire.SubmitServiceName())...),
	}
}

// workerPermissions: subscribe to its routes' attempts in their queue
// groups only (docs/architecture.md §13: its credentials may join the group
// and take its share, never receive every attempt of a route), its control
// inbox and its own micro service; publish its attempt records and, within
// resp, the replies to the attempts (and pings) it received — nothing else.
func workerPermissions(wire schemas.Wire, routes []string, resp Responses) Permissions {
	p := Permissions{Publish: []string{wire.AttemptRecordSubject()}, Responses: &resp}
	for _, r := range routes {
		p.Subscribe = append(p.Subscribe, queueSubscription(wire.AttemptSubject(r), wire.WorkerQueueGroup(r)))
	}
	p.Subscribe = append(p.Subscribe, schemas.WorkerInboxPrefix+".>")
	p.Subscribe = append(p.Subscribe, srvSubjects(wire.WorkerServiceName())...)
	return p
}

// clientPermissions: request hedgerow.submit, cancel its own requests
// (only on the cancel subjects naming it, so no other user's), find the
// gateways (a micro ping of the submit service), read its own inboxes.
func clientPermissions(wire schemas.Wire, name string) Permissions {
	return Permissions{
		Publish: []string{wire.SubmitSubject(), wire.SubmitCancelUserPrefix(name) + "*",
			micro.APIPrefix + ".PING." + wire.SubmitServiceName()},
		Subscribe: []string{schemas.ClientInbox(name) + ".>"},
	}
}

// observerPermissions: read the live records, and the kept ones through
// the records stream's read API (its info, a message by subject, ordered
// consumers of its own); publish nothing else.
func observerPermissions(wire schemas.Wire, recordsStream string) Permissions {
	return Permissions{
		Publish: []string{
			"$JS.API.STREAM.INFO." + recordsStream,
			"$JS.API.STREAM.MSG.GET." + recordsStream,
			"$JS.API.DIRECT.GET." + recordsStream + ".>",
			"$JS.API.CONSUMER.CREATE." + recordsStream,
			"$JS.API.CONSUMER.CREATE." + recordsStream + ".>",
			"$JS.API.CONSUMER.INFO." + recordsStream + ".>",
			"$JS.API.CONSUMER.DELETE." + recordsStream + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + recordsStream + ".>",
		},
		Subscribe: []string{wire.LiveRecordPrefix() + ">", schemas.ObserverInboxPrefix + ".>"},
	}
}

func union(a, b Permissions) Permissions {
	out := Permissions{Responses: a.Responses}
	if out.Responses == nil {
		out.Responses = b.Responses
	}
	for _, s := range append(slices.Clone(a.Publish), b.Publish...) {
		if !slices.Contains(out.Publish, s) {
			out.Publish = append(out.Publish, s)
		}
	}
	for _, s := range append(slices.Clone(a.Subscribe), b.Subscribe...) {
		if !slices.Contains(out.Subscribe, s) {
			out.Subscribe = append(out.Subscribe, s)
		}
	}
	return out
}

// User returns the user named name.
func (b *Bundle) User(name string) (User, bool) {
	for _, u := range b.Users {
		if u.Name == name {
			return u, true
		}
	}
	return User{}, false
}

// ServerConfigFile is the name Write gives the server configuration.
const ServerConfigFile = "nats-server.conf"

// ServerConfig is the nats-server configuration: an authorization block
// with every user's public half and permissions. Include it from a server's
// own configuration, or give it to serve as nats.server_config.
func (b *Bundle) ServerConfig() []byte {
	var s strings.Builder
	s.WriteString("# hedgerow NATS users and permissions, written by `hedgerow nats-auth`\n")
	s.WriteString("# (docs/architecture.md §13). It holds no secret: nkeys' public keys or\n")
	s.WriteString("# bcrypt hashes of passwords. Everything not allowed is denied.\n")
	s.WriteString("authorization {\n  users = [\n")
	for _, u := range b.Users {
		fmt.Fprintf(&s, "    # %s", u.Role)
		if len(u.Routes) > 0 {
			fmt.Fprintf(&s, " of routes %s", strings.Join(u.Routes, ", "))
		}
		if u.InboxPrefix != "" {
			fmt.Fprintf(&s, "; inbox prefix %s", u.InboxPrefix)
		}
		s.WriteString("\n    {")
		if b.Method == MethodNKey {
			fmt.Fprintf(&s, "nkey: %s", strconv.Quote(u.Public))
		} else {
			fmt.Fprintf(&s, "user: %s, password: %s", strconv.Quote(u.Name), strconv.Quote(u.Public))
		}
		s.WriteString(", permissions: {\n")
		fmt.Fprintf(&s, "      publish: %s\n", allowList(u.Permissions.Publish))
		fmt.Fprintf(&s, "      subscribe: %s\n", allowList(u.Permissions.Subscribe))
		if r := u.Permissions.Responses; r != nil {
			fmt.Fprintf(&s, "      allow_responses: {max: %d, expires: %q}\n", r.Max, r.Expires.String())
		}
		s.WriteString("    }}\n")
	}
	s.WriteString("  ]\n}\n")
	if b.TLS != nil {
		// Relative to this file: nats-server resolves includes so.
		fmt.Fprintf(&s, "# TLS with a client certificate the generated CA signed.\ninclude ./%s\n", TLSServerConfigFile)
	}
	return []byte(s.String())
}

// allowList is a permission that allows subjects and denies the rest (an
// empty list denies everything).
func allowList(subjects []string) string {
	if len(subjects) == 0 {
		return `{deny: [">"]}`
	}
	q := make([]string, len(subjects))
	for i, s := range subjects {
		q[i] = strconv.Quote(s)
	}
	return "{allow: [" + strings.Join(q, ", ") + "]}"
}

// Write writes the server configuration and every user's secret into dir
// (created 0700 if missing), each file 0600. It refuses to overwrite: a
// running deployment's secrets are replaced on purpose, by removing them.
func (b *Bundle) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("natsauth: %w", err)
	}
	files := map[string][]byte{ServerConfigFile: b.ServerConfig()}
	for _, u := range b.Users {
		files[u.SecretFile] = append(slices.Clone(u.Secret), '\n')
	}
	if err := writeNew(dir, files); err != nil {
		return err
	}
	if b.Gateway != nil {
		if err := b.Gateway.write(dir); err != nil {
			return err
		}
	}
	if b.TLS != nil {
		return b.TLS.write(dir, b.Gateway != nil)
	}
	return nil
}

// writeNew writes each file (name relative to dir) with mode 0600,
// refusing to overwrite one.
func writeNew(dir string, files map[string][]byte) error {
	for _, name := range slices.Sorted(maps.Keys(files)) {
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("natsauth: %w", err)
		}
		_, werr := f.Write(files[name])
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("natsauth: write %s: %w", path, werr)
		}
	}
	return nil
}

// Local is an authorization written to Dir for processes of one machine:
// `hedgerow demo` and tests that open serve's listener.
type Local struct {
	Dir string
	*Bundle
}

// WriteLocal generates nkey users for routes (serve, one worker user,
// "worker", and one client, "client") and writes them into dir.
func WriteLocal(dir string, routes []string, resp Responses) (*Local, error) {
	b, err := Generate(Spec{Routes: routes, Serve: true, Responses: resp})
	if err != nil {
		return nil, err
	}
	if err := b.Write(dir); err != nil {
		return nil, err
	}
	return &Local{Dir: dir, Bundle: b}, nil
}

// SeedFile is the path of user's nkey seed.
func (l *Local) SeedFile(user string) string { return filepath.Join(l.Dir, user+".nk") }

// ServerConfigPath is the path of the server configuration.
func (l *Local) ServerConfigPath() string { return filepath.Join(l.Dir, ServerConfigFile) }

// ServeYAML is the part of serve's nats section that uses the users: the
// server configuration and serve's own seed, indented as keys of nats.
func (l *Local) ServeYAML() string {
	return fmt.Sprintf("  server_config: %q\n  nkey_seed_file: %q\n", l.ServerConfigPath(), l.SeedFile(UserServe))
}

// Options are the options of a connection as user: its seed and its
// inbox prefix.
func (l *Local) Options(user string) ([]nats.Option, error) {
	u, ok := l.User(user)
	if !ok {
		return nil, fmt.Errorf("natsauth: no user %q", user)
	}
	seed, err := nats.NkeyOptionFromSeed(l.SeedFile(user))
	if err != nil {
		return nil, fmt.Errorf("natsauth: %w", err)
	}
	opts := []nats.Option{seed}
	if u.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(u.InboxPrefix))
	}
	return opts, nil
}

// Connect connects to url as user.
func (l *Local) Connect(url, user string, opts ...nats.Option) (*nats.Conn, error) {
	own, err := l.Options(user)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(own, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("natsauth: connect as %s: %w", user, err)
	}
	return nc, nil
}
