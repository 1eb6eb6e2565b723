package sharedgate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
)

// DefaultRedisGateTimeout bounds one Claim or Clear, Redis round trip
// included, when RedisGateOptions.Timeout is zero. A claim sits on the commit
// path of a result, so it is kept short; a Redis slower than this counts as
// down for that election.
const DefaultRedisGateTimeout = 50 * time.Millisecond

// MaxRedisGateTimeout is the largest RedisGateOptions.Timeout accepted: a
// slow Redis must never hold a finished result back for long.
const MaxRedisGateTimeout = time.Second

// DefaultRedisGatePrefix starts every key of a RedisGate when
// RedisGateOptions.Prefix is empty.
const DefaultRedisGatePrefix = "hr"

// RedisGateOptions configures a RedisGate.
type RedisGateOptions struct {
	// Prefix starts every key: <prefix>:{ua:<id>}:win and …:epoch. Empty
	// means DefaultRedisGatePrefix. It must not contain '{' or '}', which
	// would move the hash tag.
	Prefix string
	// TTL is how long Redis keeps a user action's winner and epoch after its
	// last won claim; zero means DefaultGateTTL. Like LocalGate's, it must
	// exceed the longest user action deadline.
	TTL time.Duration
	// Timeout bounds one Claim or Clear including the wait for Redis; zero
	// means DefaultRedisGateTimeout, at most MaxRedisGateTimeout.
	Timeout time.Duration
	// Local is the in-process gate consulted first. Nil makes a private one
	// with the same TTL. Passing a shared one lets other code of this
	// dispatcher see the elections.
	Local *arbiter.LocalGate
	// OnUnavailable is what a claim does when Redis cannot answer it; empty
	// means UnavailableLocal. UnavailableFallback needs Ledger.
	OnUnavailable Unavailable
	// Ledger, in fallback mode, confirms every win and decides alone while
	// Redis is unreachable. It must be nil in the other modes.
	Ledger *KVLedger
}

// Unavailable names what a RedisGate does with a claim Redis cannot answer
// (config gate.on_unavailable, docs/architecture.md §6).
type Unavailable string

const (
	// UnavailableLocal keeps the local decision: within a replica a user
	// action still commits once, across replicas it may commit twice.
	UnavailableLocal Unavailable = "local"
	// UnavailableFallback lets the ledger decide. The ledger also confirms
	// every Redis win, so it is the authority and Redis the fast path: no
	// user action commits twice, whether Redis is unreachable or restarted
	// empty. A claim neither answers is refused.
	UnavailableFallback Unavailable = "fallback"
	// UnavailableRefuse refuses the claim: no commit while Redis is down.
	UnavailableRefuse Unavailable = "refuse"
)

// ParseUnavailable reads a gate.on_unavailable value.
func ParseUnavailable(s string) (Unavailable, error) {
	u, err := parseUnavailable(s)
	return u, withPackage(err)
}

// parseUnavailable is ParseUnavailable with an error that leaves the
// package name to the caller: NewRedisGate wraps it in its own.
func parseUnavailable(s string) (Unavailable, error) {
	switch u := Unavailable(s); u {
	case UnavailableLocal, UnavailableFallback, UnavailableRefuse:
		return u, nil
	}
	return "", fmt.Errorf("%q is not one of local, fallback, refuse", s)
}

// RedisGate is the winner gate shared by every replica of one Redis
// (docs/architecture.md §6). A claim first goes through the LocalGate — authoritative for
// the groups this dispatcher owns; a local loss returns without asking Redis.
// A local win is then confirmed by one Lua script that, atomically, either
// finds the user action's current holder or increments the user action's
// epoch and sets <prefix>:{ua:<id>}:win to "group/attempt/epoch" with
// SET NX PX. Redis decides: the value it holds is the claim's Value, or the
// Holder a losing claim learns. A Redis win replaces the local entry's value
// with Redis', so later local claims of this replica lose at once to the
// holder Redis names; a Redis loss releases the local entry, as the local
// gate is authoritative only for this dispatcher's own groups.
//
// Claims of one user action on one RedisGate are serialised — they are rare
// (a caller retry racing its original, or consecutive hedge attempts of one
// group) — so that a local loser waits for the in-flight Redis answer, at
// most Timeout, and names the holder Redis confirmed rather than a local
// winner that Redis may overrule.
//
// Degraded operation: when Redis fails or does not answer within Timeout,
// Claim returns the local decision together with an error wrapping
// ErrGateDegraded; the local decision stands. Two replicas deciding locally
// during an outage can each elect a winner for the same user action — the
// gate never lets one group commit twice, but across replicas it is then
// best-effort. The same holds across a Redis failover (or a restart without
// persistence): replication is asynchronous, so the promoted server may have
// lost a winner key — and its epoch key, so an epoch number can be issued
// again — and a later claim from another replica can then win as well. The
// local gate still holds within each replica, so no group ever commits
// twice; effect executors that must act once per user action compare the
// whole gate value (group/attempt/epoch), not the epoch alone (docs/architecture.md §6).
//
// Timeout is enforced through the context, which go-redis honours on reads
// only with ContextTimeoutEnabled, so NewRedisGate requires it of the
// go-redis clients it can inspect.
type RedisGate struct {
	client        redis.UniversalClient
	local         *arbiter.LocalGate
	prefix        string
	ttlMS         int64
	timeout       time.Duration
	onUnavailable Unavailable
	ledger        *KVLedger
	locks         actionLocks
}

var _ arbiter.Gate = (*RedisGate)(nil)

// claimScript elects the winner of one user action. KEYS[1] is the winner
// key, KEYS[2] the epoch key (same hash tag, same slot); ARGV[1] is the
// claimant "group/attempt", ARGV[2] the TTL in milliseconds. It returns
// {1, value} when the claimant holds the gate — newly, or again when its own
// value is already there (idempotent re-claim, no new epoch) — and
// {0, holder} when another claimant holds it. Group ids may contain '/', so
// "own value" means the claimant's prefix followed by digits only.
var claimScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. '/'
if cur then
  if string.sub(cur, 1, #mine) == mine and string.find(cur, '^%d+$', #mine + 1) then
    return {1, cur}
  end
  return {0, cur}
end
local epoch = redis.call('INCR', KEYS[2])
local value = mine .. string.format('%d', epoch)
if not redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
  return redis.error_reply('gate key appeared inside the script')
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {1, value}
`)

// clearScript deletes the winner key KEYS[1] only if it still holds the
// value ARGV[1]; it returns the number of keys deleted. The epoch key stays,
// so the next winner's epoch is higher.
var clearScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// adoptScript replaces the winner key KEYS[1] holding ARGV[1] with the
// ledger's holder ARGV[2] (TTL ARGV[3] ms) and raises the epoch key KEYS[2]
// to the holder's epoch ARGV[4], so later claims lose at once to the holder
// the ledger chose. A key meanwhile holding something else is left alone.
var adoptScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[4]) then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[3])
end
return 1
`)

// NewRedisGate returns a gate over client, which may be a standalone,
// cluster or failover client.
func NewRedisGate(client redis.UniversalClient, cfg RedisGateOptions) (*RedisGate, error) {
	if client == nil {
		return nil, errors.New("sharedgate: redis gate: a client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultRedisGatePrefix
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("sharedgate: redis gate: prefix %q must not contain '{' or '}'", cfg.Prefix)
	}
	if cfg.TTL == 0 {
		cfg.TTL = arbiter.DefaultGateTTL
	}
	if cfg.TTL < time.Millisecond {
		return nil, fmt.Errorf("sharedgate: redis gate: ttl %v must be at least 1ms", cfg.TTL)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultRedisGateTimeout
	}
	if cfg.Timeout < 0 || cfg.Timeout > MaxRedisGateTimeout {
		return nil, fmt.Errorf("sharedgate: redis gate: timeout %v not in (0, %v]", cfg.Timeout, MaxRedisGateTimeout)
	}
	if !redisstore.FollowsContextDeadlines(client) {
		return nil, errors.New("sharedgate: redis gate: the client must set ContextTimeoutEnabled, so that Timeout bounds a claim")
	}
	if cfg.OnUnavailable == "" {
		cfg.OnUnavailable = UnavailableLocal
	}
	if _, err := parseUnavailable(string(cfg.OnUnavailable)); err != nil {
		return nil, fmt.Errorf("sharedgate: redis gate: on unavailable: %w", err)
	}
	if (cfg.OnUnavailable == UnavailableFallback) != (cfg.Ledger != nil) {
		return nil, fmt.Errorf("sharedgate: redis gate: a ledger goes with fallback mode, and only with it (mode %s)", cfg.OnUnavailable)
	}
	local := cfg.Local
	if local == nil {
		var err error
		if local, err = arbiter.NewLocalGate(arbiter.LocalGateOptions{TTL: cfg.TTL}); err != nil {
			return nil, fmt.Errorf("sharedgate: redis gate: %w", err)
		}
	}
	return &RedisGate{
		client: client, local: local, prefix: cfg.Prefix,
		ttlMS: cfg.TTL.Milliseconds(), timeout: cfg.Timeout,
		onUnavailable: cfg.OnUnavailable, ledger: cfg.Ledger,
		locks: actionLocks{held: make(map[string]chan struct{})},
	}, nil
}

// Local returns the in-process gate consulted before Redis.
func (g *RedisGate) Local() *arbiter.LocalGate { return g.local }

// Claim implements Gate. See RedisGate for how Redis and the local gate
// combine. When Redis cannot answer, the mode decides: local returns the
// local decision with an error wrapping ErrGateDegraded; refuse returns an
// error wrapping ErrGateUnavailable and no decision; fallback asks the
// ledger, which also confirms every Redis win.
func (g *RedisGate) Claim(ctx context.Context, userAction, group string, attempt int) (arbiter.Claim, error) {
	if userAction == "" || group == "" || attempt < 0 {
		return arbiter.Claim{}, fmt.Errorf("sharedgate: %w: user action %q, group %q, attempt %d", arbiter.ErrInvalidClaim, userAction, group, attempt)
	}
	redisCtx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	// If the wait for another claim of this user action times out, the
	// claim goes on unserialised: the local CAS still decides, and a local
	// win meets the expired context below and degrades.
	release := g.locks.acquire(redisCtx, userAction)
	defer release()

	local, err := g.local.Claim(redisCtx, userAction, group, attempt)
	if err != nil || !local.Won {
		return local, err
	}

	proposal, redisErr := g.claimRedis(redisCtx, userAction, group, attempt)
	if redisErr == nil && (!proposal.won || g.ledger == nil) {
		g.local.Adopt(userAction, local.Value, proposal.holder, proposal.won)
		return claimOf(userAction, group, attempt, proposal.holder, proposal.won), nil
	}
	if redisErr != nil {
		switch g.onUnavailable {
		case UnavailableLocal:
			return local, fmt.Errorf("sharedgate: gate claim %s: %w: %w", group, arbiter.ErrGateDegraded, redisErr)
		case UnavailableRefuse:
			g.giveBack(ctx, local, "", false)
			return arbiter.Claim{}, fmt.Errorf("sharedgate: gate claim %s: %w: redis: %w", group, arbiter.ErrGateUnavailable, redisErr)
		}
		proposal.holder, _ = arbiter.ParseGateValue(local.Value)
	}

	// Fallback: the ledger decides every win, Redis' or the local one.
	holder, won, err := g.ledger.propose(ctx, userAction, proposal.holder)
	if err != nil {
		// The write may have landed before its answer was lost: give the
		// holding back everywhere, so the user action stays claimable.
		g.giveBack(ctx, local, proposal.holder.String(), redisErr == nil)
		return arbiter.Claim{}, fmt.Errorf("sharedgate: gate claim %s: %w: ledger: %w (redis: %v)", group, arbiter.ErrGateUnavailable, err, redisErr)
	}
	if redisErr == nil && holder != proposal.holder {
		// Redis forgot the holder (it restarted empty) or never saw it (the
		// ledger decided while this gate could not reach Redis): teach it.
		g.adoptRedis(ctx, userAction, proposal.holder, holder)
	}
	g.local.Adopt(userAction, local.Value, holder, won)
	return claimOf(userAction, group, attempt, holder, won), nil
}

// redisAnswer is claimScript's decision.
type redisAnswer struct {
	won    bool
	holder arbiter.GateValue
}

// claimRedis runs claimScript for the claimant; an error means Redis did
// not decide.
func (g *RedisGate) claimRedis(ctx context.Context, userAction, group string, attempt int) (redisAnswer, error) {
	res, err := claimScript.Run(ctx, g.client, g.keys(userAction), group+"/"+strconv.Itoa(attempt), g.ttlMS).Slice()
	if err != nil {
		return redisAnswer{}, err
	}
	won, holder, err := parseClaimReply(res)
	return redisAnswer{won: won, holder: holder}, err
}

// claimOf is the Claim of a decided election.
func claimOf(userAction, group string, attempt int, holder arbiter.GateValue, won bool) arbiter.Claim {
	c := arbiter.Claim{UserAction: userAction, Group: group, Attempt: attempt, Won: won, Epoch: holder.Epoch, Holder: holder.String()}
	if won {
		c.Value = c.Holder
	}
	return c
}

// giveBack undoes the holdings of a refused claim: the local win, and the
// value shared proposed in Redis (inRedis says Redis holds it) and the
// ledger, compare-and-delete, each bounded by its own timeout. Failures are
// left to the TTLs: until then the user action loses to a claim that never
// committed.
func (g *RedisGate) giveBack(ctx context.Context, local arbiter.Claim, shared string, inRedis bool) {
	ctx = context.WithoutCancel(ctx)
	_ = g.local.Clear(ctx, local)
	if inRedis {
		redisCtx, cancel := context.WithTimeout(ctx, g.timeout)
		_, _ = clearScript.Run(redisCtx, g.client, g.keys(local.UserAction)[:1], shared).Result()
		cancel()
	}
	if g.ledger != nil && shared != "" {
		_, _ = g.ledger.release(ctx, local.UserAction, shared)
	}
}

// adoptRedis replaces the holding Redis gave (from) with the ledger's
// holder (to). It is best effort: a Redis that keeps the wrong holder only
// makes later claims lose to it, never win.
func (g *RedisGate) adoptRedis(ctx context.Context, userAction string, from, to arbiter.GateValue) {
	redisCtx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	_, _ = adoptScript.Run(redisCtx, g.client, g.keys(userAction), from.String(), to.String(), g.ttlMS, to.Epoch).Result()
}

// parseClaimReply reads claimScript's {won, holder}. A holder that does not
// parse means something else wrote the key: that is a fault of the shared
// gate, so the caller degrades to the local decision.
func parseClaimReply(res []any) (bool, arbiter.GateValue, error) {
	if len(res) != 2 {
		return false, arbiter.GateValue{}, fmt.Errorf("claim script returned %d values, want 2", len(res))
	}
	flag, ok1 := res[0].(int64)
	raw, ok2 := res[1].(string)
	if !ok1 || !ok2 {
		return false, arbiter.GateValue{}, fmt.Errorf("claim script returned %T, %T; want integer, string", res[0], res[1])
	}
	holder, err := arbiter.ParseGateValue(raw)
	if err != nil {
		return false, arbiter.GateValue{}, fmt.Errorf("winner key holds a foreign value: %w", err)
	}
	return flag == 1, holder, nil
}

// Clear implements Gate: compare-and-delete in Redis, then in the local
// gate. It returns ErrNotHolder only when neither held the claim's value.
// When Redis fails the local entry is still cleared and the error wraps
// ErrGateDegraded; the Redis key then lapses with its TTL, and until it
// does, claims of other replicas for this user action lose to the cleared
// claim.
func (g *RedisGate) Clear(ctx context.Context, c arbiter.Claim) error {
	if c.UserAction == "" {
		return fmt.Errorf("sharedgate: %w: clear without a user action", arbiter.ErrInvalidClaim)
	}
	if !c.Won || c.Value == "" {
		return fmt.Errorf("sharedgate: clear %s: %w", c.Group, arbiter.ErrNotHolder)
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	release := g.locks.acquire(ctx, c.UserAction)
	defer release()

	// All are cleared whatever the others answer: a Redis failover may
	// have lost the key while the local entry still holds it, or the local
	// entry may have lapsed while Redis still holds the key.
	deleted, redisErr := clearScript.Run(ctx, g.client, g.keys(c.UserAction)[:1], c.Value).Int64()
	localErr := g.local.Clear(ctx, c)
	var released bool
	var ledgerErr error
	if g.ledger != nil {
		released, ledgerErr = g.ledger.release(context.WithoutCancel(ctx), c.UserAction, c.Value)
	}
	switch {
	case ledgerErr != nil:
		return fmt.Errorf("sharedgate: gate clear %s: %w: ledger: %w", c.Group, arbiter.ErrGateUnavailable, ledgerErr)
	case redisErr != nil && g.ledger == nil:
		return fmt.Errorf("sharedgate: gate clear %s: %w: %w", c.Group, arbiter.ErrGateDegraded, redisErr)
	case deleted == 0 && localErr != nil && !released:
		return fmt.Errorf("sharedgate: clear %s: %w", c.Group, arbiter.ErrNotHolder)
	}
	return nil
}

// keys returns the winner and epoch keys of a user action; both carry the
// hash tag {ua:<escaped id>} so one script can touch both in a cluster.
func (g *RedisGate) keys(userAction string) []string {
	tag := g.prefix + ":{ua:" + escapeKeyPart(userAction) + "}:"
	return []string{tag + "win", tag + "epoch"}
}

// keyEscaper percent-encodes the characters that would end or restart a
// hash tag, and '%' itself so that encoding stays one-to-one: two distinct
// user action ids always give distinct keys.
var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func escapeKeyPart(s string) string { return keyEscaper.Replace(s) }

// actionLocks serialises the claims and clears of one user action on one
// gate. An entry's channel is closed when its holder releases it.
type actionLocks struct {
	mu   sync.Mutex
	held map[string]chan struct{}
}

// acquire waits until no other operation on userAction is in flight here,
// then holds it until release is called. If ctx ends first it stops waiting
// and returns a release that does nothing.
func (l *actionLocks) acquire(ctx context.Context, userAction string) (release func()) {
	for {
		l.mu.Lock()
		busy, ok := l.held[userAction]
		if !ok {
			mine := make(chan struct{})
			l.held[userAction] = mine
			l.mu.Unlock()
			return func() {
				l.mu.Lock()
				delete(l.held, userAction)
				l.mu.Unlock()
				close(mine)
			}
		}
		l.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return func() {}
		}
	}
}
