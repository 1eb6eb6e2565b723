package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// maxEventLine bounds one line of a stream; a chunk is far smaller.
const maxEventLine = 1 << 20

// chatChunk is a chat.completion.chunk, or the error object hedgerow sends
// in its place when a committed stream fails.
type chatChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Type    string  `json:"type"`
		Code    *string `json:"code"`
		Message string  `json:"message"`
	} `json:"error"`
}

// streamAnswer is what a streamed chat completion said.
type streamAnswer struct {
	text   string
	finish string // the one finish_reason; empty when none came
	// finishes counts the chunks that set a finish_reason.
	finishes int
	// usage is the usage chunk's completion_tokens; -1 when none came.
	usage  int
	done   bool // data: [DONE] ended the stream
	chunks int
	// errCode is the code of an error event that ended the stream
	// (stream_interrupted when a committed stream broke), and errSeen says
	// one came at all (an error without a code has an empty code).
	errCode string
	errSeen bool
}

// errMalformed is a stream that is not a chat completion stream at all:
// the answer is invalid, whatever its text.
var errMalformed = errors.New("malformed stream")

// joinStream reads a whole chat completion stream of server-sent events
// and joins its content deltas. Every event must be a chunk of one id, an
// error object, or the final [DONE]; anything after [DONE] or after an
// error event, a chunk that is not JSON, and a usage chunk before the
// finish are errMalformed.
func joinStream(body []byte) (streamAnswer, error) {
	a := streamAnswer{usage: -1}
	var text strings.Builder
	var id string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 4096), maxEventLine)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, ":") {
			continue // event separators and keep-alive comments
		}
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			return a, fmt.Errorf("%w: line %q is no data line", errMalformed, line)
		}
		data = strings.TrimPrefix(data, " ")
		switch {
		case a.done:
			return a, fmt.Errorf("%w: an event after [DONE]", errMalformed)
		case a.errSeen:
			return a, fmt.Errorf("%w: an event after the error event", errMalformed)
		case data == "[DONE]":
			a.done = true
			continue
		}
		var c chatChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return a, fmt.Errorf("%w: event %d is not JSON: %v", errMalformed, a.chunks+1, err)
		}
		if c.Error != nil {
			a.errSeen = true
			if c.Error.Code != nil {
				a.errCode = *c.Error.Code
			}
			continue
		}
		a.chunks++
		switch {
		case c.Object != "chat.completion.chunk":
			return a, fmt.Errorf("%w: chunk %d is a %q", errMalformed, a.chunks, c.Object)
		case id == "":
			id = c.ID
		case c.ID != id:
			return a, fmt.Errorf("%w: chunk %d has id %q, the stream %q", errMalformed, a.chunks, c.ID, id)
		}
		if a.usage >= 0 {
			return a, fmt.Errorf("%w: chunk %d after the usage chunk", errMalformed, a.chunks)
		}
		if c.Usage != nil && len(c.Choices) == 0 {
			if a.finishes == 0 {
				return a, fmt.Errorf("%w: the usage chunk before the finish", errMalformed)
			}
			a.usage = c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				return a, fmt.Errorf("%w: chunk %d has choice %d", errMalformed, a.chunks, ch.Index)
			}
			if ch.Delta.Content != nil {
				if a.finishes > 0 && *ch.Delta.Content != "" {
					return a, fmt.Errorf("%w: content after the finish", errMalformed)
				}
				text.WriteString(*ch.Delta.Content)
			}
			if ch.FinishReason != nil {
				a.finishes++
				a.finish = *ch.FinishReason
			}
		}
	}
	a.text = text.String()
	if err := sc.Err(); err != nil {
		return a, fmt.Errorf("%w: %v", errMalformed, err)
	}
	return a, nil
}

// checkStream says why a streamed answer is not the whole answer want,
// or "" when it is: well-formed (chunks, one finish_reason, stop, the
// usage chunk asked for, [DONE]), no error event, and its joined text
// exactly want — no token repeated or missing. The usage counts at least
// the answer's tokens (one a word).
func checkStream(a streamAnswer, err error, want string) string {
	switch {
	case err != nil:
		return err.Error()
	case a.errSeen:
		return fmt.Sprintf("error event %q", a.errCode)
	case !a.done:
		return "no [DONE]"
	case a.finishes != 1:
		return fmt.Sprintf("%d finish reasons", a.finishes)
	case a.finish != "stop":
		return fmt.Sprintf("finish %q", a.finish)
	case a.text != want:
		return textDiff(a.text, want)
	case a.usage < 0:
		return "no usage chunk"
	case a.usage < len(strings.Fields(want)):
		return fmt.Sprintf("usage counts %d completion tokens, the answer has %d", a.usage, len(strings.Fields(want)))
	}
	return ""
}

// completion is a non-streamed chat completion.
type completion struct {
	Object  string `json:"object"`
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// checkCompletion says why a non-streamed answer (status and body) is not
// the whole answer want, or "" when it is.
func checkCompletion(status int, body []byte, want string) string {
	if status != 200 {
		return fmt.Sprintf("status %d: %.200s", status, body)
	}
	var c completion
	switch err := json.Unmarshal(body, &c); {
	case err != nil:
		return fmt.Sprintf("not JSON: %v", err)
	case c.Object != "chat.completion" || len(c.Choices) != 1:
		return fmt.Sprintf("a %q of %d choices", c.Object, len(c.Choices))
	case c.Choices[0].FinishReason != "stop":
		return fmt.Sprintf("finish %q", c.Choices[0].FinishReason)
	case c.Choices[0].Message.Content != want:
		return textDiff(c.Choices[0].Message.Content, want)
	}
	return ""
}

// textDiff says where got departs from want, in words (tokens), without
// quoting either whole.
func textDiff(got, want string) string {
	g, w := strings.Fields(got), strings.Fields(want)
	i := 0
	for i < len(g) && i < len(w) && g[i] == w[i] {
		i++
	}
	return fmt.Sprintf("text differs at word %d: %d words, want %d", i+1, len(g), len(w))
}

// percentile returns the nearest-rank q-quantile of ds (q in (0, 1]); 0
// for none. Of ten samples P50 is the 5th and P99 the 10th, the largest.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(q * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}
