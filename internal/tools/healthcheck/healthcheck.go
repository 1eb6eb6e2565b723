// Package healthcheck is `hedgerow healthcheck`: one HTTP GET of a probe
// URL, for container images that hold nothing but hedgerow (no curl in a
// scratch image), as a HEALTHCHECK or a compose healthcheck runs it.
package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/hedgerow/hedgerow/internal/redact"
)

// DefaultTimeout bounds the whole check (connect, request, headers) when
// no timeout is given.
const DefaultTimeout = 3 * time.Second

// Check GETs target and returns nil when it answers 2xx within timeout
// (DefaultTimeout when zero or less); otherwise an error of one line that
// says why: the connection refused, the timeout, or the status. Redirects
// are not followed (a probe that redirects is misconfigured), and the
// URL's password, if any, never appears in the error.
func Check(ctx context.Context, target string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s is not an http:// or https:// URL", redact.URL(target))
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", redact.URL(target), redact.Error(err))
	}
	client := &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true, Proxy: nil},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %s", redact.URL(target), reason(err, timeout))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s answered %s", redact.URL(target), resp.Status)
	}
	return nil
}

// reason is a failed request's cause in a few words.
func reason(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return fmt.Sprintf("no answer within %s", timeout)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	}
	return redact.Error(err).Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
