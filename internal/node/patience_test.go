package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// retryLog is a slog.Handler that keeps the retry lines a wait logs and
// signals each one.
type retryLog struct {
	mu    sync.Mutex
	lines []string
	tries chan struct{}
}

func newRetryLog() *retryLog { return &retryLog{tries: make(chan struct{}, 1024)} }

func (l *retryLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *retryLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *retryLog) WithGroup(string) slog.Handler            { return l }
func (l *retryLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	if strings.Contains(r.Message, "retrying") {
		l.tries <- struct{}{}
	}
	return nil
}

func (l *retryLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// awaitTry waits for the wait's next logged retry.
func (l *retryLog) awaitTry(t *testing.T) {
	t.Helper()
	select {
	case <-l.tries:
	case <-time.After(wait):
		t.Fatalf("no retry logged; log:\n%s", l.text())
	}
}

// TestWaitForRedisRetriesUntilRedisAnswersAndStopsWhenAsked: a Redis down
// at start is waited for (each try logged) until it answers; a wrong
// password is retried, logged without the password, and given up on past
// the bound; a cancelled wait returns at once with the context's error.
func TestWaitForRedisRetriesUntilRedisAnswersAndStopsWhenAsked(t *testing.T) {
	t.Run("down at start, then up", func(t *testing.T) {
		rs := redistest.Start(t)
		rs.Kill()
		log := newRetryLog()
		done := make(chan error, 1)
		go func() {
			done <- WaitForRedis(context.Background(), config.Redis{URL: rs.URL(), Timeout: time.Second}, 0, slog.New(log))
		}()
		log.awaitTry(t)
		log.awaitTry(t)
		rs.Restart()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("WaitForRedis once Redis answers: %v", err)
			}
		case <-time.After(wait):
			t.Fatalf("WaitForRedis did not return once Redis answered; log:\n%s", log.text())
		}
	})
	t.Run("a wrong password is retried until the bound, never logged", func(t *testing.T) {
		const secret = "zqwrongredispass"
		rs := redistest.Start(t, "--requirepass", "right-one")
		t.Setenv("HEDGEROW_TEST_REDIS_PASSWORD", secret)
		log := newRetryLog()
		err := WaitForRedis(context.Background(), config.Redis{URL: rs.URL(), PasswordEnv: "HEDGEROW_TEST_REDIS_PASSWORD", Timeout: time.Second},
			700*time.Millisecond, slog.New(log))
		if !errors.Is(err, ErrGaveUp) || strings.Contains(err.Error(), secret) {
			t.Fatalf("WaitForRedis with a wrong password: %v, want ErrGaveUp without the password", err)
		}
		if text := log.text(); !strings.Contains(text, "redis does not answer yet; retrying") || strings.Contains(text, secret) {
			t.Fatalf("log, want retries without the password:\n%s", text)
		}
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		rs := redistest.Start(t)
		rs.Kill()
		ctx, cancel := context.WithCancel(context.Background())
		log := newRetryLog()
		done := make(chan error, 1)
		go func() { done <- WaitForRedis(ctx, config.Redis{URL: rs.URL(), Timeout: time.Second}, 0, slog.New(log)) }()
		log.awaitTry(t)
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled WaitForRedis: %v, want context.Canceled", err)
			}
		case <-time.After(wait):
			t.Fatal("WaitForRedis did not stop when cancelled")
		}
	})
}
