package httpdoor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
)

// replayStoreTimeout bounds one store call made after the caller's answer
// is written, when the request's own context may already be done.
const replayStoreTimeout = 2 * time.Second

// replayedHeaders are the headers a replay repeats: what the answer is and
// how it was won. Trailers of a stream are repeated as headers.
var replayedHeaders = append([]string{"Content-Type", "Cache-Control"}, hedgeHeaders...)

// serveIdempotent serves a request naming an Idempotency-Key, Stripe's way
// (docs/architecture.md §2): the committed answer of the same key and
// request is replayed; while a request of the key is in flight on this
// door, the same request joins it (waits, then replays its answer, or runs
// as a new try when it failed); another request under a key already in use
// is refused idempotency_key_reused. Only committed answers written whole
// are kept: a retry after a failure is a new try.
func (h *handler) serveIdempotent(w http.ResponseWriter, r *http.Request, dl dialect, sub dispatcher.Submission, includeUsage bool) {
	key := replay.Key(sub.Tenant, sub.IdempotencyKey)
	fp, err := requestFingerprint(dl, r.URL.Path, sub, includeUsage)
	if err != nil {
		h.writeSubmitError(w, r, dl, err)
		return
	}
	for {
		if h.replayed(w, r, dl, key, fp) {
			return
		}
		fl, leader := h.flights.Join(key, fp)
		if !leader {
			if fl.Fingerprint() != fp {
				dl.writeFailure(w, frontdoor.IdempotencyKeyReused())
				return
			}
			select {
			case <-fl.Done():
				continue // replayed next time round, or a new try
			case <-r.Context().Done():
				w.WriteHeader(frontdoor.StatusClientClosedRequest)
				return
			}
		}
		defer h.flights.Leave(key, fl)
		// A leader that finished between the look-up and join stored its
		// answer already: look once more before running again.
		if !h.replayed(w, r, dl, key, fp) {
			h.lead(w, r, dl, sub, includeUsage, key, fp)
		}
		return
	}
}

// lead runs the request, recording what it writes, and keeps a committed
// answer written whole.
func (h *handler) lead(w http.ResponseWriter, r *http.Request, dl dialect, sub dispatcher.Submission, includeUsage bool, key, fp string) {
	rec := &recorder{ResponseWriter: w, max: h.opts.ReplayMaxBytes}
	if !h.serve(rec, r, dl, sub, includeUsage) || rec.over || rec.status != http.StatusOK {
		return
	}
	a := &replay.Answer{Fingerprint: fp, Status: rec.status, Header: map[string]string{}, Body: rec.body}
	for _, name := range replayedHeaders {
		if v := w.Header().Get(name); v != "" {
			a.Header[name] = v
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), replayStoreTimeout)
	defer cancel()
	if err := h.opts.Replays.Put(ctx, key, a, h.opts.ReplayTTL); err != nil {
		// Not kept: a retry meets the winner gate and is answered 409.
		h.log.Warn("committed answer not kept for replay", "err", err, "bytes", len(a.Body))
	}
}

// replayed writes the committed answer stored under key, or refuses a
// different request under the key; false when there is none (or the store
// failed, when the winner gate still guards the user action).
func (h *handler) replayed(w http.ResponseWriter, r *http.Request, dl dialect, key, fp string) bool {
	a, err := h.opts.Replays.Get(r.Context(), key)
	if err != nil {
		h.log.Warn("replay store unavailable", "err", err)
		return false
	}
	if a == nil {
		return false
	}
	if a.Fingerprint != fp {
		dl.writeFailure(w, frontdoor.IdempotencyKeyReused())
		return true
	}
	hdr := w.Header()
	for name, v := range a.Header {
		hdr.Set(name, v)
	}
	hdr.Set(frontdoor.HeaderIdempotentReplayed, "true")
	hdr.Set("Content-Length", strconv.Itoa(len(a.Body)))
	w.WriteHeader(a.Status)
	if _, err := w.Write(a.Body); err != nil {
		h.log.Debug("replay not written: client gone", "err", err)
	}
	return true
}

// requestFingerprint hashes what makes a request the same request: the
// dialect, the path, the model, the canonical request and the stream's
// usage option (docs/architecture.md §2).
func requestFingerprint(dl dialect, path string, sub dispatcher.Submission, includeUsage bool) (string, error) {
	canonical, err := json.Marshal(struct {
		Pool         string `json:"pool"`
		Request      any    `json:"request"`
		IncludeUsage bool   `json:"include_usage"`
	}{sub.Pool, sub.Request, includeUsage})
	if err != nil {
		return "", fmt.Errorf("httpdoor: encode the request's fingerprint: %w", err)
	}
	return replay.Fingerprint(fmt.Sprintf("%T", dl), path, canonical), nil
}

// recorder passes every write through to the caller and keeps a copy of
// the status and body, up to max bytes, for replay.
type recorder struct {
	http.ResponseWriter
	max    int
	status int
	body   []byte
	over   bool // more than max bytes were written: nothing is kept
}

func (rec *recorder) WriteHeader(status int) {
	if rec.status == 0 {
		rec.status = status
	}
	rec.ResponseWriter.WriteHeader(status)
}

func (rec *recorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if !rec.over {
		if len(rec.body)+len(b) > rec.max {
			rec.over, rec.body = true, nil
		} else {
			rec.body = append(rec.body, b...)
		}
	}
	return rec.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController flush the caller's writer.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }
