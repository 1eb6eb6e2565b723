// Package sketchshare lets the dispatcher replicas that share one Redis
// share their latency sketches, so that every replica computes the same
// hedge delay from the same distribution (docs/architecture.md §5).
//
// Each replica publishes its own samples of each cohort — delay.Estimator's
// Snapshot, never what it merged from others — as one field of a Redis hash
// per cohort, reads every other replica's field of that hash, and merges
// them with delay.Estimator.Merge, which replaces the previous peer samples.
// One pipelined round trip per sync carries every cohort of every class. A
// field carries its publication time, and fields older than MaxAge are
// dropped by whoever reads them next, so a replica that dies ages out.
//
// Sharing is an optimisation, never a dependency: when Redis is down a
// replica keeps its own samples (and the peer samples of its last good
// round, until they roll out of the window), and it shares again as soon as
// Redis answers.
package sketchshare

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
)

// DefaultPrefix starts every key of an Exchange when ExchangeOptions.Prefix is
// empty.
const DefaultPrefix = "hr"

// maxIndexedCohorts bounds how many cohorts of one class a round learns from
// the index: cohorts are few by construction (operation × model × stream ×
// seven max_tokens buckets), so the bound only stops a runaway index.
const maxIndexedCohorts = 1024

// ExchangeOptions configures an Exchange.
type ExchangeOptions struct {
	// ReplicaID names this replica's fields; it must be unique among the
	// replicas sharing the Redis, and stable for a process's life.
	ReplicaID string
	// Prefix starts every key; empty means DefaultPrefix. It must not
	// contain '{' or '}', which would move the hash tags.
	Prefix string
	// MaxAge is how long a replica's published snapshots stay in use after
	// it last published; zero means the default delay window
	// (delay.DefaultOptions().Window). Set it to the estimators' Window: a
	// dead replica's samples then count exactly as long as they would have
	// in its own window. Replica clocks are compared at this scale, so skew
	// must stay well below it.
	MaxAge time.Duration
}

// Exchange publishes this replica's cohort snapshots and fetches every other
// replica's in one pipelined Redis round trip. Keys, for class K and cohort C:
//
//	<prefix>:{sk:K:C}  hash: field = replica id, value = that replica's
//	                   snapshots of C with their publication time
//	<prefix>:{skx:K}   sorted set of the cohorts of K published within MaxAge
//	                   (score: last publication, ms), so that a replica
//	                   learns cohorts it has not served yet
//
// Both expire MaxAge after their last publication. It is safe for
// concurrent use.
type Exchange struct {
	client   redis.UniversalClient
	prefix   string
	replica  string
	maxAgeMS int64
}

// exchangeScript publishes one replica's field of a cohort hash and returns
// the other replicas' fresh fields, dropping the stale ones. KEYS[1] is the
// hash; ARGV: own field, own value ("" removes it: nothing of our own is in
// the window), now (ms), max age (ms). It returns {field, value, …}. A value
// whose timestamp does not parse is returned, not deleted, so the reader
// counts it as corrupt; it goes with the hash's expiry.
var exchangeScript = redis.NewScript(`
local key, own = KEYS[1], ARGV[1]
local now, maxAge = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[2] ~= '' then
  redis.call('HSET', key, own, ARGV[2])
  redis.call('PEXPIRE', key, maxAge)
else
  redis.call('HDEL', key, own)
end
local all = redis.call('HGETALL', key)
local out = {}
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  if field ~= own then
    local ts = tonumber(string.match(value, '^(%d+)|'))
    if ts and now - ts > maxAge then
      redis.call('HDEL', key, field)
    else
      out[#out + 1] = field
      out[#out + 1] = value
    end
  end
end
return out
`)

// NewExchange returns an Exchange over client, which may be a standalone,
// cluster or failover client.
func NewExchange(client redis.UniversalClient, cfg ExchangeOptions) (*Exchange, error) {
	if client == nil {
		return nil, errors.New("sketchshare: a client is required")
	}
	if cfg.ReplicaID == "" || len(cfg.ReplicaID) > 256 {
		return nil, fmt.Errorf("sketchshare: replica id of %d bytes, want 1 to 256", len(cfg.ReplicaID))
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("sketchshare: prefix %q must not contain '{' or '}'", cfg.Prefix)
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = delay.DefaultOptions().Window
	}
	if cfg.MaxAge < time.Millisecond {
		return nil, fmt.Errorf("sketchshare: max age %v must be at least 1ms", cfg.MaxAge)
	}
	return &Exchange{client: client, prefix: cfg.Prefix, replica: cfg.ReplicaID, maxAgeMS: cfg.MaxAge.Milliseconds()}, nil
}

// ReplicaID returns the id this replica publishes under.
func (x *Exchange) ReplicaID() string { return x.replica }

// Publication is one cohort of one class in a round: this replica's own
// snapshots to publish, possibly none (the cohort is then only fetched, and
// a field this replica published earlier is removed).
type Publication struct {
	Class     string
	Cohort    delay.Cohort
	Snapshots []delay.SlotSnapshot
}

// PeerSnapshots is what one other replica published for a cohort.
type PeerSnapshots struct {
	Replica   string
	Published time.Time
	Snapshots []delay.SlotSnapshot
}

// CohortPeers is the round's answer for one Publication.
type CohortPeers struct {
	Class  string
	Cohort delay.Cohort
	// Err is set when this cohort's command failed (e.g. one cluster node
	// was down); Peers is then empty and must not replace earlier peers.
	Err   error
	Peers []PeerSnapshots
}

// Round is the outcome of one Exchange call.
type Round struct {
	// Cohorts answers each Publication, in order.
	Cohorts []CohortPeers
	// Indexed lists, per class asked for, the cohorts some replica
	// published within MaxAge, sorted by key. Absent for a class whose
	// index could not be read.
	Indexed map[string][]delay.Cohort
	// Corrupt holds one error, wrapping ErrCorruptPeerData, per peer field
	// or index entry that was ignored.
	Corrupt []error
}

// cohortKey and indexKey escape class and cohort names so that neither can
// end the hash tag nor fake the ':' between them.
func (x *Exchange) cohortKey(class string, c delay.Cohort) string {
	return x.prefix + ":{sk:" + escapeKeyPart(class) + ":" + escapeKeyPart(c.Key()) + "}"
}

func (x *Exchange) indexKey(class string) string {
	return x.prefix + ":{skx:" + escapeKeyPart(class) + "}"
}

var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D", ":", "%3A")

func escapeKeyPart(s string) string { return keyEscaper.Replace(s) }

// Exchange publishes pubs and reads the peers' snapshots of the same
// cohorts, plus the cohort index of each class in classes, in one pipelined
// round trip (in a cluster: one per node, in parallel). now stamps the
// publications and judges the age of the peers'. The error is set when
// Redis could not be reached or some commands failed; the Round then holds
// whatever did succeed.
func (x *Exchange) Exchange(ctx context.Context, now time.Time, classes []string, pubs []Publication) (Round, error) {
	nowMS := now.UnixMilli()
	minScore := "(" + strconv.FormatInt(nowMS-x.maxAgeMS, 10)
	fields := make([]string, len(pubs))
	published := map[string][]any{}
	for i, p := range pubs {
		if len(p.Snapshots) > 0 {
			fields[i] = encodeField(now, p.Snapshots)
			published[p.Class] = append(published[p.Class], p.Cohort.Key())
		}
	}

	pipe := x.client.Pipeline()
	scripts := make([]*redis.Cmd, len(pubs))
	for i, p := range pubs {
		scripts[i] = exchangeScript.EvalSha(ctx, pipe, []string{x.cohortKey(p.Class, p.Cohort)}, x.replica, fields[i], nowMS, x.maxAgeMS)
	}
	indexes := make([]*redis.StringSliceCmd, len(classes))
	for i, class := range classes {
		key := x.indexKey(class)
		if members := published[class]; len(members) > 0 {
			zs := make([]redis.Z, len(members))
			for j, m := range members {
				zs[j] = redis.Z{Score: float64(nowMS), Member: m}
			}
			pipe.ZAdd(ctx, key, zs...)
			pipe.PExpire(ctx, key, time.Duration(x.maxAgeMS)*time.Millisecond)
		}
		pipe.ZRemRangeByScore(ctx, key, "-inf", minScore)
		indexes[i] = pipe.ZRange(ctx, key, 0, maxIndexedCohorts-1)
	}
	_, execErr := pipe.Exec(ctx) // every command's own error is read below

	// Right after a Redis restart or failover the script cache is empty:
	// send the script's source for those commands, once.
	var retry []int
	for i, cmd := range scripts {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		pipe := x.client.Pipeline()
		for _, i := range retry {
			p := pubs[i]
			scripts[i] = exchangeScript.Eval(ctx, pipe, []string{x.cohortKey(p.Class, p.Cohort)}, x.replica, fields[i], nowMS, x.maxAgeMS)
		}
		_, _ = pipe.Exec(ctx)
	}

	if execErr != nil && allFailed(scripts, indexes) {
		return Round{}, fmt.Errorf("sketchshare: exchange round trip: %w", execErr)
	}

	var (
		round = Round{Cohorts: make([]CohortPeers, len(pubs)), Indexed: map[string][]delay.Cohort{}}
		errs  []error
	)
	for i, p := range pubs {
		cp := CohortPeers{Class: p.Class, Cohort: p.Cohort}
		res, err := scripts[i].Slice()
		if err != nil {
			cp.Err = fmt.Errorf("sketchshare: exchange %s %s: %w", p.Class, p.Cohort, err)
			errs = append(errs, cp.Err)
		} else {
			cp.Peers, round.Corrupt = x.decodePeers(p, res, round.Corrupt)
		}
		round.Cohorts[i] = cp
	}
	for i, class := range classes {
		members, err := indexes[i].Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("sketchshare: cohort index of %s: %w", class, err))
			continue
		}
		cohorts := make([]delay.Cohort, 0, len(members))
		for _, m := range members {
			c, err := delay.ParseCohortKey(m)
			if err != nil {
				round.Corrupt = append(round.Corrupt, fmt.Errorf("%w: index of %s: %w", ErrCorruptPeerData, class, err))
				continue
			}
			cohorts = append(cohorts, c)
		}
		sort.Slice(cohorts, func(a, b int) bool { return cohorts[a].Key() < cohorts[b].Key() })
		round.Indexed[class] = cohorts
	}
	return round, errors.Join(errs...)
}

// decodePeers turns the script's {field, value, …} into peer snapshots,
// appending an error to corrupt for each field that does not decode.
func (x *Exchange) decodePeers(p Publication, res []any, corrupt []error) ([]PeerSnapshots, []error) {
	if len(res)%2 != 0 {
		return nil, append(corrupt, fmt.Errorf("%w: %s %s: exchange returned %d values", ErrCorruptPeerData, p.Class, p.Cohort, len(res)))
	}
	peers := make([]PeerSnapshots, 0, len(res)/2)
	for j := 0; j < len(res); j += 2 {
		field, ok1 := res[j].(string)
		value, ok2 := res[j+1].(string)
		if !ok1 || !ok2 {
			corrupt = append(corrupt, fmt.Errorf("%w: %s %s: exchange returned %T, %T", ErrCorruptPeerData, p.Class, p.Cohort, res[j], res[j+1]))
			continue
		}
		published, snaps, err := decodeField(value)
		if err != nil {
			corrupt = append(corrupt, fmt.Errorf("%w: %s %s from replica %q: %w", ErrCorruptPeerData, p.Class, p.Cohort, field, err))
			continue
		}
		peers = append(peers, PeerSnapshots{Replica: field, Published: published, Snapshots: snaps})
	}
	sort.Slice(peers, func(a, b int) bool { return peers[a].Replica < peers[b].Replica })
	return peers, corrupt
}

// allFailed reports whether no command of the round succeeded: Redis was
// not reached at all, which is one error rather than one per cohort.
func allFailed(scripts []*redis.Cmd, indexes []*redis.StringSliceCmd) bool {
	for _, c := range scripts {
		if c.Err() == nil {
			return false
		}
	}
	for _, c := range indexes {
		if c.Err() == nil {
			return false
		}
	}
	return true
}
