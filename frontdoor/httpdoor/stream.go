package dispatcher

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// sseStream writes a streaming chat completion as server-sent events. It is
// the Sink of its submission, so it runs on the handler's goroutine.
//
// Nothing is written before the commit: the status line and headers go out
// with the first committed delta, so a group that fails before its commit
// still answers with a plain JSON error and its status. The X-Hedgerow-*
// headers describe the commit, which the Sink does not learn from a Delta;
// if the dispatcher told it first (Committed) they are headers, otherwise
// they are declared as HTTP trailers and sent after the last event. Nothing
// but the headers waits: every event is flushed as it is written.
type sseStream struct {
	w            http.ResponseWriter
	rc           *http.ResponseController
	model        string
	created      int64
	includeUsage bool
	id           string
	commit       *Response // known before the first byte: hedge headers, not trailers
	started      bool      // the status line, headers and role chunk were sent
	trailers     bool      // hedge headers were declared as trailers
	writeErr     error     // the client is gone; every later write fails
}

// Committed hands the stream the commit before its first delta, so the
// X-Hedgerow-* values travel as headers and the chunk ids name the group.
// A dispatcher calls it when its Sink has the method; later calls are
// ignored, as the headers are already out.
func (s *sseStream) Committed(resp *Response) {
	if !s.started {
		s.commit = resp
	}
}

// Delta writes one piece of the committed stream.
func (s *sseStream) Delta(d Delta) error {
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
	return s.event(s.chunk([]chunkChoice{{Delta: delta}}))
}

// start sends the status line, the headers and the role chunk, once.
func (s *sseStream) start() error {
	if s.writeErr != nil {
		return s.writeErr
	}
	if s.started {
		return nil
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // proxies must not hold events back
	if s.commit != nil {
		setHedgeHeaders(h, s.commit)
		s.id = completionID(s.commit.GroupID)
	} else {
		h.Set("Trailer", strings.Join(hedgeHeaders, ", "))
		s.trailers = true
		s.id = completionID("")
	}
	s.w.WriteHeader(http.StatusOK)
	empty := ""
	return s.event(s.chunk([]chunkChoice{{Delta: chunkDelta{Role: "assistant", Content: &empty}}}))
}

// finish ends a successful stream: the finish reason, the usage when asked
// for, [DONE], and the hedge trailers.
func (s *sseStream) finish(resp *Response) error {
	if !s.started {
		s.Committed(resp) // an empty answer: nothing was sent yet
	}
	if err := s.start(); err != nil {
		return err
	}
	reason := finishReason(resp)
	if err := s.event(s.chunk([]chunkChoice{{Delta: chunkDelta{}, FinishReason: &reason}})); err != nil {
		return err
	}
	if s.includeUsage {
		u, err := json.Marshal(newUsage(resp.Usage))
		if err != nil {
			return fmt.Errorf("encode usage: %w", err)
		}
		c := s.chunk([]chunkChoice{})
		c.Usage = u
		if err := s.event(c); err != nil {
			return err
		}
	}
	if err := s.write([]byte("data: [DONE]\n\n")); err != nil {
		return err
	}
	if s.trailers {
		setHedgeHeaders(s.w.Header(), resp)
	}
	return nil
}

// fail ends a stream whose bytes already reached the caller with an error
// event and no [DONE], so no client mistakes it for a complete answer.
func (s *sseStream) fail(e *apiError) error {
	return s.event(e)
}

func (s *sseStream) chunk(choices []chunkChoice) completionChunk {
	c := completionChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model, Choices: choices}
	if s.includeUsage {
		c.Usage = json.RawMessage("null")
	}
	return c
}

func (s *sseStream) event(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	return s.write(buf)
}

// write sends and flushes one event; the first failure means the client is
// gone, and it is returned to the dispatcher, which cancels the group.
func (s *sseStream) write(b []byte) error {
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
