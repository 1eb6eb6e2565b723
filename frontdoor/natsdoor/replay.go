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
// with Idempotent-Replayed: true —; a twin of a request in flight on this
// door waits for it; another request under the key is refused
// idempotency_key_reused (409). A failure is not kept.
func (s *Service) serveIdempotent(ctx context.Context, c *natsCall, sub dispatcher.Submission, sink *natsSink) {
	key := replay.Key(sub.Tenant, sub.IdempotencyKey)
	canonical, err := json.Marshal(struct {
		Pool    string              `json:"pool"`
		Request schemas.ChatRequest `json:"request"`
	}{sub.Pool, sub.Request})
	if err != nil {
		s.fail(c.reply, &frontdoor.Failure{Code: frontdoor.CodeInternal, Message: "The request could not be encoded."})
		return
	}
	fp := replay.Fingerprint("nats", schemas.SubmitSubject, canonical)
	for {
		if s.replayed(ctx, c.reply, key, fp) {
			return
		}
		fl, leader := s.flights.Join(key, fp)
		if !leader {
			if fl.Fingerprint() != fp {
				s.fail(c.reply, frontdoor.IdempotencyKeyReused())
				return
			}
			select {
			case <-fl.Done():
				continue
			case <-ctx.Done():
				return // the caller cancelled: nobody is left to tell
			}
		}
		defer s.flights.Leave(key, fl)
		if s.replayed(ctx, c.reply, key, fp) {
			return
		}
		rec := &frames{max: s.opts.ReplayMaxBytes}
		if sink != nil {
			sink.chunks = rec
		}
		final := s.run(ctx, c, sub, sink)
		if final == nil {
			return
		}
		rec.add(final)
		if rec.over {
			return
		}
		body, err := json.Marshal(rec.frames)
		if err != nil {
			return
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replayStoreTimeout)
		defer cancel()
		if err := s.opts.Replays.Put(pctx, key, &replay.Answer{Fingerprint: fp, Status: 200, Body: body}, s.opts.ReplayTTL); err != nil {
			s.log.Warn("committed answer not kept for replay", "err", err, "bytes", len(body))
		}
		return
	}
}

// replayed sends the committed answer stored under key again, or refuses
// another request under the key; false when there is none (or the store
// failed: the winner gate still guards the user action).
func (s *Service) replayed(ctx context.Context, reply, key, fp string) bool {
	a, err := s.opts.Replays.Get(ctx, key)
	if err != nil {
		s.log.Warn("replay store unavailable", "err", err)
		return false
	}
	if a == nil {
		return false
	}
	if a.Fingerprint != fp {
		s.fail(reply, frontdoor.IdempotencyKeyReused())
		return true
	}
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
