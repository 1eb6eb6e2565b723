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
	"github.com/hedgerow/hedgerow/schemas"
)

// replayStoreTimeout bounds one store call made after the caller's answer
// is written, when the request's own context may already be done.
const replayStoreTimeout = 2 * time.Second

// replayedHeaders are the headers a replay repeats: what the answer is and
// how it was won. Trailers of a stream are repeated as headers.
var replayedHeaders = append([]string{"Content-Type", "Cache-Control"}, hedgeHeaders...)

// serveIdempotent serves a request naming an Idempotency-Key, Stripe's way
// (docs/architecture.md §2): the committed answer of the same key and
// request is replayed; while the same request of the key is in flight — on
// this door or on a replica sharing the store — this one joins it (waits,
// then replays its answer, or runs as a new try when it failed); one whose
// gateway died mid-flight (its lease lapsed, no answer) is taken over;
// another request under a key already in use is refused
// idempotency_key_reused. Only committed answers written whole are kept: a
// retry after a failure is a new try; one whose answer was delivered but
// too large to keep is refused answer_not_kept.
func (h *handler) serveIdempotent(w http.ResponseWriter, r *http.Request, dl dialect, sub dispatcher.Submission, includeUsage bool) {
	key := replay.Key(sub.Tenant, sub.IdempotencyKey)
	fp, err := requestFingerprint(dl, r.URL.Path, sub, includeUsage)
	if err != nil {
		h.writeSubmitError(w, r, dl, err)
		return
	}
	ctx := r.Context()
	if sub.Deadline > 0 { // the caller's own deadline bounds the wait too
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, sub.Deadline)
		defer cancel()
	}
	if sub.GroupID == "" {
		sub.GroupID = h.d.NewGroupID()
	}
	turn, err := h.flights.Begin(ctx, key, fp, sub.GroupID)
	switch {
	case err != nil && r.Context().Err() != nil:
		w.WriteHeader(frontdoor.StatusClientClosedRequest)
		return
	case err != nil:
		dl.writeFailure(w, frontdoor.FailureFor(&dispatcher.GroupError{Code: schemas.ErrDeadlineExceeded}))
		return
	case turn.Reused:
		dl.writeFailure(w, frontdoor.IdempotencyKeyReused())
		return
	case turn.NotKept:
		dl.writeFailure(w, frontdoor.AnswerNotKept())
		return
	case turn.CommittedIn != "":
		dl.writeFailure(w, frontdoor.CommittedInRegion(turn.CommittedIn))
		return
	case turn.Answer != nil:
		h.replay(w, turn.Answer)
		return
	}
	h.lead(w, r, dl, sub, includeUsage, key, fp, turn.Lead)
}

// lead runs the request, recording what it writes, and keeps a committed
// answer written whole — or, when it is over the recorder's bound, its
// tombstone (docs/architecture.md §2); any other end releases the key's
// lease.
func (h *handler) lead(w http.ResponseWriter, r *http.Request, dl dialect, sub dispatcher.Submission, includeUsage bool, key, fp string, l *replay.Lead) {
	if l.StoreErr != nil {
		h.log.Warn("replay store unavailable", "err", l.StoreErr)
	}
	if l.Supersedes != "" {
		h.log.Info("idempotent request taken over from a gateway that died mid-flight")
	}
	if l.RunsAgain != "" {
		h.log.Info("idempotent request committed in an unheard region runs again here", "committed_in", l.RunsAgain)
	}
	sub.Supersedes = l.Supersedes
	rec := &recorder{ResponseWriter: w, max: h.opts.ReplayMaxBytes}
	var a *replay.Answer
	delivered := h.serve(rec, r, dl, sub, includeUsage) && rec.status == http.StatusOK
	switch {
	case delivered && rec.over:
		a = replay.NotKeptAnswer(fp)
		h.log.Info("committed answer over the replay bound: only its tombstone is kept", "max_entry_bytes", rec.max)
	case delivered:
		a = &replay.Answer{Fingerprint: fp, Status: rec.status, Header: map[string]string{}, Body: rec.body}
		for _, name := range replayedHeaders {
			if v := w.Header().Get(name); v != "" {
				a.Header[name] = v
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), replayStoreTimeout)
	defer cancel()
	if a == nil && rec.status == http.StatusOK && r.Context().Err() != nil {
		// The caller left a committed stream midway: its retry takes the
		// request over at once rather than meet the commit (409).
		if err := l.Orphan(ctx); err != nil {
			h.log.Warn("in-flight marker not lapsed", "err", err)
		}
		return
	}
	if err := l.End(ctx, a, h.opts.ReplayTTL); err != nil && a != nil {
		// Not kept: a retry meets the winner gate and is answered 409.
		h.log.Warn("committed answer not kept for replay", "err", err, "bytes", len(a.Body))
	} else if err != nil {
		h.log.Warn("in-flight marker not released", "err", err)
	}
}

// replay writes a committed answer again, marked Idempotent-Replayed.
func (h *handler) replay(w http.ResponseWriter, a *replay.Answer) {
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
