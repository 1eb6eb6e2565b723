// Package guardshare shares the guardrails' disablings among the
// dispatcher replicas of one Redis (docs/architecture.md §5): a cohort one
// replica switched off — a ceiling breach, failing hedges, a flat gain — is
// off on every replica for the same cool-down, instead of each replica
// waiting for its own share of the evidence.
//
// Each class has one Redis hash, <prefix>:{gr:<class>}, with a field per
// disabled cohort (its delay.Cohort key) holding "<reason>|<since unix ms>".
// Every sync, in one pipelined round trip, a replica writes the disablings
// its guardrails hold and reads every class's hash, then adopts each entry
// (delay.Guardrail.Adopt keeps the newer of two disablings and ignores
// one whose cool-down ended); a field whose cool-down ended is deleted by
// whoever reads it. Sharing is best effort: with Redis down each replica's
// guardrail goes on deciding alone.
package guardshare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
)

// DefaultInterval is how often Run syncs.
const DefaultInterval = time.Second

// Guardrail is what a class's guardrail offers the sharing.
type Guardrail interface {
	Disabled(now time.Time) []delay.Disabling
	Adopt(c delay.Cohort, now time.Time, reason delay.GuardrailReason, since time.Time) error
	Options() delay.GuardrailOptions
}

// Sharer syncs the disablings of its classes' guardrails through Redis.
type Sharer struct {
	client redis.UniversalClient
	prefix string
	guards map[string]Guardrail
	log    *slog.Logger
}

// New returns a Sharer of the guardrails by class name, under keys starting
// with prefix ("hr" when empty; no '{' or '}').
func New(client redis.UniversalClient, prefix string, guards map[string]Guardrail, log *slog.Logger) (*Sharer, error) {
	if prefix == "" {
		prefix = "hr"
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("guardshare: prefix %q holds a hash-tag brace", prefix)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sharer{client: client, prefix: prefix, guards: guards, log: log}, nil
}

func (s *Sharer) key(class string) string {
	return s.prefix + ":{gr:" + strings.NewReplacer("{", "%7B", "}", "%7D").Replace(class) + "}"
}

// SyncOnce publishes this replica's disablings and adopts every replica's,
// at now.
func (s *Sharer) SyncOnce(ctx context.Context, now time.Time) error {
	pipe := s.client.Pipeline()
	reads := map[string]*redis.MapStringStringCmd{}
	for class, g := range s.guards {
		key := s.key(class)
		for _, d := range g.Disabled(now) {
			pipe.HSet(ctx, key, d.Cohort.Key(), string(d.Reason)+"|"+strconv.FormatInt(d.Since.UnixMilli(), 10))
		}
		reads[class] = pipe.HGetAll(ctx, key)
		pipe.PExpire(ctx, key, 2*g.Options().CoolDown+time.Minute)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("guardshare: sync: %w", err)
	}
	var errs []error
	for class, cmd := range reads {
		g := s.guards[class]
		var stale []string
		for field, v := range cmd.Val() {
			reason, ms, ok := strings.Cut(v, "|")
			sinceMs, err := strconv.ParseInt(ms, 10, 64)
			c, cerr := delay.ParseCohortKey(field)
			if !ok || err != nil || cerr != nil {
				errs = append(errs, fmt.Errorf("guardshare: class %s: bad entry %q=%q", class, field, v))
				stale = append(stale, field)
				continue
			}
			since := time.UnixMilli(sinceMs)
			if !now.Before(since.Add(g.Options().CoolDown)) {
				stale = append(stale, field)
				continue
			}
			if err := g.Adopt(c, now, delay.GuardrailReason(reason), since); err != nil {
				errs = append(errs, fmt.Errorf("guardshare: class %s: %w", class, err))
			}
		}
		if len(stale) > 0 {
			// A replica that rewrote one of these fields since holds that
			// disabling and writes it again at its next sync.
			s.client.HDel(ctx, s.key(class), stale...)
		}
	}
	return errors.Join(errs...)
}

// Run syncs every DefaultInterval until ctx ends, logging failures once
// per change between working and failing.
func (s *Sharer) Run(ctx context.Context) {
	t := time.NewTicker(DefaultInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			err := s.SyncOnce(ctx, now)
			switch {
			case err != nil && !failing && ctx.Err() == nil:
				s.log.Warn("guardrail sharing failing; each replica decides alone", "err", err)
			case err == nil && failing:
				s.log.Info("guardrail sharing works again")
			}
			failing = err != nil
		}
	}
}
