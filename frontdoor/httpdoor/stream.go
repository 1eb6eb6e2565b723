package httpdoor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
)

// sseWriter is what the streams of both dialects share: server-sent events
// written on the handler's goroutine, as the Sink of a submission.
//
// Nothing is written before the commit: the status line and headers go out
// with the first committed delta, so a group that fails before its commit
// still answers with a plain JSON error and its status. The X-Hedgerow-*
// headers describe the commit, which the Sink does not learn from a Delta;
// if the dispatcher told it first (Committed) they are headers, otherwise
// they are declared as HTTP trailers and sent after the last event. Nothing
// but the headers waits: every event is flushed as it is written.
type sseWriter struct {
	w        http.ResponseWriter
	rc       *http.ResponseController
	commit   *dispatcher.Response // known before the first byte: hedge headers, not trailers
	started  bool                 // the status line and headers were sent
	trailers bool                 // hedge headers were declared as trailers
	writeErr error                // the client is gone; every later write fails
}

func newSSEWriter(w http.ResponseWriter) sseWriter {
	return sseWriter{w: w, rc: http.NewResponseController(w)}
}

// Committed hands the stream the commit before its first delta, so the
// X-Hedgerow-* values travel as headers and the ids name the group. A
// dispatcher calls it when its Sink has the method; later calls are
// ignored, as the headers are already out.
func (s *sseWriter) Committed(resp *dispatcher.Response) {
	if !s.started {
		s.commit = resp
	}
}

func (s *sseWriter) sent() (bool, error) { return s.started, s.writeErr }

// begin sends the status line and the headers, once; it reports whether
// this call sent them, and the group id the stream's ids name (empty when
// the commit is not known yet).
func (s *sseWriter) begin() (first bool, group string, err error) {
	if s.writeErr != nil {
		return false, "", s.writeErr
	}
	if s.started {
		return false, "", nil
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // proxies must not hold events back
	if s.commit != nil {
		setHedgeHeaders(h, s.commit)
		group = s.commit.GroupID
	} else {
		h.Set("Trailer", strings.Join(hedgeHeaders, ", "))
		s.trailers = true
	}
	s.w.WriteHeader(http.StatusOK)
	return true, group, nil
}

// end sends the hedge trailers of a stream whose commit was not known
// before its first byte.
func (s *sseWriter) end(resp *dispatcher.Response) {
	if s.trailers {
		setHedgeHeaders(s.w.Header(), resp)
	}
}

// event writes one event, named unless name is empty, and flushes it.
func (s *sseWriter) event(name string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	buf := make([]byte, 0, len(data)+len(name)+16)
	if name != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, name...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	return s.write(buf)
}

// write sends and flushes bytes; the first failure means the client is
// gone, and it is returned to the dispatcher, which cancels the group.
func (s *sseWriter) write(b []byte) error {
	if s.writeErr != nil {
		return s.writeErr
	}
	if _, err := s.w.Write(b); err != nil {
		s.writeErr = fmt.Errorf("write event: %w", err)
		return s.writeErr
	}
	if err := s.rc.Flush(); err != nil {
		s.writeErr = fmt.Errorf("flush event: %w", err)
		return s.writeErr
	}
	return nil
}

// completionStream writes a streaming chat completion as OpenAI chunks.
type completionStream struct {
	sseWriter
	model        string
	created      int64
	includeUsage bool
	id           string
}

var _ dispatcher.CommitSink = (*completionStream)(nil)

// Delta writes one piece of the committed stream.
func (s *completionStream) Delta(d dispatcher.Delta) error {
	if err := s.start(); err != nil {
		return err
	}
	delta := chunkDelta{ToolCalls: validRaw(d.ToolCalls)}
	if d.Content != "" {
		delta.Content = &d.Content
	}
	if delta.Content == nil && delta.ToolCalls == nil {
		return nil
	}
	return s.event("", s.chunk([]chunkChoice{{Delta: delta}}))
}

// start sends the status line, the headers and the role chunk, once.
func (s *completionStream) start() error {
	first, group, err := s.begin()
	if !first || err != nil {
		return err
	}
	s.id = completionID(group)
	empty := ""
	return s.event("", s.chunk([]chunkChoice{{Delta: chunkDelta{Role: "assistant", Content: &empty}}}))
}

// finish ends a successful stream: the finish reason, the usage when asked
// for, [DONE], and the hedge trailers.
func (s *completionStream) finish(resp *dispatcher.Response) error {
	s.Committed(resp) // an empty answer: nothing was sent yet
	if err := s.start(); err != nil {
		return err
	}
	reason := finishReason(resp)
	if err := s.event("", s.chunk([]chunkChoice{{Delta: chunkDelta{}, FinishReason: &reason}})); err != nil {
		return err
	}
	if s.includeUsage {
		u, err := json.Marshal(newUsage(resp.Usage))
		if err != nil {
			return fmt.Errorf("encode usage: %w", err)
		}
		c := s.chunk([]chunkChoice{})
		c.Usage = u
		if err := s.event("", c); err != nil {
			return err
		}
	}
	if err := s.write([]byte("data: [DONE]\n\n")); err != nil {
		return err
	}
	s.end(resp)
	return nil
}

// fail ends a stream whose bytes already reached the caller with an error
// event and no [DONE], so no client mistakes it for a complete answer.
func (s *completionStream) fail(f *frontdoor.Failure) error {
	return s.event("", openAIError(f))
}

func (s *completionStream) chunk(choices []chunkChoice) completionChunk {
	c := completionChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model, Choices: choices}
	if s.includeUsage {
		c.Usage = json.RawMessage("null")
	}
	return c
}
