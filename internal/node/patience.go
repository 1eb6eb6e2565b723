package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/redact"
)

// Patience at start (docs/architecture.md §2): a process whose NATS or
// Redis does not answer yet waits for it, retrying with backoff, instead
// of exiting — in a cluster the two often start together, and a process
// that exits is restarted into a crash loop. It is not ready meanwhile:
// nothing listens until its dependencies answer.
const (
	// FirstRetry is the wait before the second try; each wait doubles,
	// up to LastRetry, with ±20 % jitter so a fleet restarted at once
	// does not retry in step.
	FirstRetry = 250 * time.Millisecond
	LastRetry  = 5 * time.Second
)

// ErrGaveUp wraps the last error of a wait that ran out of its bound.
var ErrGaveUp = errors.New("gave up waiting")

// retryWait is the wait before try n+1 (n ≥ 1): FirstRetry doubled n-1
// times, capped at LastRetry, jittered by up to ±20 %.
func retryWait(n int) time.Duration {
	d := FirstRetry
	for i := 1; i < n && d < LastRetry; i++ {
		d *= 2
	}
	d = min(d, LastRetry)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// waitFor calls try until it succeeds, it fails with an error retryable
// refuses, ctx ends (ctx's error, wrapped) or, with a positive bound, bound
// has passed since the first try (ErrGaveUp with the last error). Each
// failed try is logged in one line: what is awaited, the try, the next
// wait and the error, which try must have stripped of credentials.
func waitFor(ctx context.Context, what string, bound time.Duration, log *slog.Logger, retryable func(error) bool, try func() error) error {
	var giveUp <-chan time.Time
	if bound > 0 {
		t := time.NewTimer(bound)
		defer t.Stop()
		giveUp = t.C
	}
	for n := 1; ; n++ {
		err := try()
		if err == nil {
			if n > 1 {
				log.Info(what+" answered", "tries", n)
			}
			return nil
		}
		if !retryable(err) {
			return err
		}
		wait := retryWait(n)
		log.Warn(what+" does not answer yet; retrying", "try", n, "in", wait.Round(time.Millisecond), "err", err)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("stopped waiting for %s: %w", what, ctx.Err())
		case <-giveUp:
			timer.Stop()
			return fmt.Errorf("%w for %s after %s: %w", ErrGaveUp, what, bound, err)
		case <-timer.C:
		}
	}
}

// ConnectPatiently is Connect retried with backoff while no server answers
// (or refuses the credentials, which may be rotated in), until ctx ends or,
// with a positive bound, bound has passed. An error no wait can mend — no
// URL, one that does not parse — is returned at once.
func ConnectPatiently(ctx context.Context, urls []string, name string, bound time.Duration, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var nc *nats.Conn
	err := waitFor(ctx, "nats", bound, log, natsRetryable, func() error {
		var err error
		nc, err = Connect(urls, name, log, opts...)
		return err
	})
	return nc, err
}

// natsRetryable says whether a failed connect may succeed later: no
// server answered, one answered too slowly or closed on us, or refused
// the credentials.
func natsRetryable(err error) bool {
	var ne net.Error
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, io.EOF) || errors.As(err, &ne)
}

// WaitForRedis returns once the Redis redis.url names answers a PING
// (with the configured credentials and TLS), retrying with backoff until
// ctx ends or, with a positive bound, bound has passed; with no redis.url
// it returns at once. Every failure is retried — a wrong password too,
// which a fixed Secret mends — and logged without credentials.
func WaitForRedis(ctx context.Context, cfg config.Redis, bound time.Duration, log *slog.Logger) error {
	if cfg.URL == "" {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	client, err := redisClient(cfg, os.Getenv)
	if err != nil {
		return err
	}
	defer client.Close()
	timeout := max(cfg.Timeout, time.Second)
	return waitFor(ctx, "redis", bound, log, func(error) bool { return true }, func() error {
		try, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := client.Ping(try).Err(); err != nil {
			return fmt.Errorf("redis: ping %s: %w", redact.URL(cfg.URL), redact.Error(err))
		}
		return nil
	})
}
