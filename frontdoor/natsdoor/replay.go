package natsdoor

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/schemas"
)

// replayStoreTimeout bounds one store call made after the answer is sent.
const replayStoreTimeout = 2 * time.Second

// serveIdempotent serves a request naming an idempotency key as the HTTP
// door does (docs/architecture.md §2): the committed answer of the same
// key and request is sent again — its chunks, then its response, each
// with Idempotent-Replayed: true —; a twin of a request in flight, on this
// door or a replica sharing the store, waits for it; one whose gateway died
// mid-flight is taken over; another request under the key is refused
// idempotency_key_reused (409). A failure is not kept; an answer too large
// to keep leaves its tombstone, and a retry is refused answer_not_kept.
func (s *Service) serveIdempotent(ctx context.Context, c *natsCall, sub dispatcher.Submission, sink *natsSink) {
	key := replay.Key(sub.Tenant, sub.IdempotencyKey)
	fp, err := requestFingerprint(sub)
	if err != nil {
		s.fail(c.reply, &frontdoor.Failure{Code: frontdoor.CodeInternal, Message: "The request could not be encoded."})
		return
	}
	wctx := ctx
	if sub.Deadline > 0 { // the caller's own deadline bounds the wait too
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, sub.Deadline)
		defer cancel()
	}
	sub.GroupID = s.d.NewGroupID()
	turn, err := s.flights.Begin(wctx, key, fp, sub.GroupID)
	switch {
	case err != nil && ctx.Err() != nil:
		s.endCanceled(ctx, c) // the caller cancelled, or went away
		return
	case err != nil:
		s.fail(c.reply, frontdoor.FailureFor(&dispatcher.GroupError{Code: schemas.ErrDeadlineExceeded}))
		return
	case turn.Reused:
		s.fail(c.reply, frontdoor.IdempotencyKeyReused())
		return
	case turn.NotKept:
		s.fail(c.reply, frontdoor.AnswerNotKept())
		return
	case turn.CommittedIn != "":
		s.fail(c.reply, frontdoor.CommittedInRegion(turn.CommittedIn))
		return
	case turn.Answer != nil:
		if !s.replay(c.reply, turn.Answer) {
			s.fail(c.reply, &frontdoor.Failure{Code: frontdoor.CodeInternal, Message: "The stored answer could not be read."})
		}
		return
	}
	l := turn.Lead
	if l.StoreErr != nil {
		s.log.Warn("replay store unavailable", "err", l.StoreErr)
	}
	if l.RunsAgain != "" {
		s.log.Info("idempotent request committed in an unheard region runs again here", "committed_in", l.RunsAgain)
	}
	sub.Supersedes = l.Supersedes
	rec := &frames{max: s.opts.ReplayMaxBytes}
	if sink != nil {
		sink.chunks = rec
	}
	var a *replay.Answer
	if final := s.run(ctx, c, sub, sink); final != nil {
		rec.add(final)
		if rec.over {
			a = replay.NotKeptAnswer(fp) // delivered, too large to keep: a retry is refused answer_not_kept
		} else if body, err := json.Marshal(rec.frames); err == nil {
			a = &replay.Answer{Fingerprint: fp, Status: 200, Body: body}
		}
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replayStoreTimeout)
	defer cancel()
	if a == nil && len(rec.frames) > 0 && ctx.Err() != nil {
		// The caller left a committed stream midway: its retry takes the
		// request over at once rather than meet the commit (409).
		if err := l.Orphan(pctx); err != nil {
			s.log.Warn("in-flight marker not lapsed", "err", err)
		}
		return
	}
	if err := l.End(pctx, a, s.opts.ReplayTTL); err != nil {
		s.log.Warn("committed answer not kept for replay, or in-flight marker not released", "err", err)
	}
}

// requestFingerprint hashes what makes a submission the same request: the
// door, its subject, the model and the canonical request.
func requestFingerprint(sub dispatcher.Submission) (string, error) {
	canonical, err := json.Marshal(struct {
		Pool    string              `json:"pool"`
		Request schemas.ChatRequest `json:"request"`
	}{sub.Pool, sub.Request})
	if err != nil {
		return "", fmt.Errorf("natsdoor: encode the request's fingerprint: %w", err)
	}
	return replay.Fingerprint("nats", schemas.SubmitSubject, canonical), nil
}

// replay sends a committed answer again — its messages, each with
// Idempotent-Replayed: true —; false when it cannot be read.
func (s *Service) replay(reply string, a *replay.Answer) bool {
	var msgs []json.RawMessage
	if err := json.Unmarshal(a.Body, &msgs); err != nil || len(msgs) == 0 {
		s.log.Warn("stored answer unreadable: not replayed", "err", err)
		return false
	}
	for i, data := range msgs {
		status := schemas.StatusChunk
		if i == len(msgs)-1 {
			status = schemas.StatusDone
		}
		h := nats.Header{schemas.HeaderStatus: {status}, frontdoor.HeaderIdempotentReplayed: {"true"}}
		if err := s.nc.PublishMsg(&nats.Msg{Subject: reply, Header: h, Data: data}); err != nil {
			s.log.Debug("replay not sent", "err", fmt.Errorf("publish: %w", err))
			return true
		}
	}
	return true
}

// frames are the messages of one answer as sent: its chunks, then its
// response, up to max bytes in all.
type frames struct {
	max    int
	size   int
	frames []json.RawMessage
	over   bool // more than max bytes: nothing is kept
}

// add records one message; a nil frames records nothing.
func (f *frames) add(data []byte) {
	if f == nil || f.over {
		return
	}
	if f.size+len(data) > f.max {
		f.over, f.frames = true, nil
		return
	}
	f.size += len(data)
	f.frames = append(f.frames, data)
}
