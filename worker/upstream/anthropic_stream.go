package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hedgerow/hedgerow/schemas"
)

// FinishReason maps a Messages stop_reason to the canonical finish reason
// the arbiter and the OpenAI front door read. A reason without a canonical
// equivalent (pause_turn) is passed on as is, which the arbiter treats as
// incomplete.
func FinishReason(stopReason string) string {
	switch stopReason {
	case "end_turn", "stop_sequence":
		return "stop"
	case "max_tokens", "model_context_window_exceeded":
		return "length"
	case "tool_use":
		return "tool_calls"
	case "refusal":
		return "content_filter"
	}
	return stopReason
}

// messagesEvent is the part of a Messages stream event the adapter reads.
// Its type is in the data as well as in the SSE event name; the data's is
// used, as the SDKs do.
type messagesEvent struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message *struct {
		Usage messagesUsage `json:"usage"`
	} `json:"message"`
	ContentBlock *messagesBlock `json:"content_block"`
	Delta        *struct {
		Type        string  `json:"type"`
		Text        string  `json:"text"`
		PartialJSON string  `json:"partial_json"`
		Thinking    string  `json:"thinking"`
		StopReason  *string `json:"stop_reason"`
	} `json:"delta"`
	Usage *messagesUsage  `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// messagesBlock is a content_block_start's block: what it says of the block
// before its deltas.
type messagesBlock struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	ID       string          `json:"id"`
	Name     string          `json:"name"`
	Input    json.RawMessage `json:"input"`
	Thinking string          `json:"thinking"`
	Data     string          `json:"data"` // a redacted_thinking block's
}

// messagesUsage is a Messages usage object. Every count is cumulative for
// the message; absent counts are nil.
type messagesUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// input returns the input units the usage reports: uncached, cache-written
// and cache-read tokens together, all of which the provider bills.
func (u messagesUsage) input() (int64, bool) {
	if u.InputTokens == nil {
		return 0, false
	}
	n := *u.InputTokens
	for _, c := range []*int64{u.CacheCreationInputTokens, u.CacheReadInputTokens} {
		if c != nil {
			n += *c
		}
	}
	return n, true
}

// messageStream folds a Messages event stream into an Outcome. Text and
// tool calls go through the OpenAI adapter's accumulator, in OpenAI's delta
// shape, so both adapters hand the worker the same Delta and Outcome.
type messageStream struct {
	acc *accumulator

	inputTokens  int64 // reported input units
	sawInput     bool
	outputTokens int64 // latest cumulative output_tokens
	finalUsage   bool  // a message_delta reported the message's usage

	tools    map[int]int  // content block index → tool-call index
	toolArgs map[int]bool // tool-call index → argument text arrived
	stopped  bool         // message_stop arrived
}

func newMessageStream(sink Sink, inputEstimate int64) *messageStream {
	return &messageStream{acc: newAccumulator(sink, inputEstimate), tools: map[int]int{}, toolArgs: map[int]bool{}}
}

// event folds one event. It returns the data of an error event, or an error
// if the data is not a Messages event.
func (s *messageStream) event(typ, data []byte) (json.RawMessage, error) {
	var e messagesEvent
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("decode %s event: %w", typ, err)
	}
	if e.Type == "" {
		e.Type = string(typ)
	}
	switch e.Type {
	case "error":
		return bytes.Clone(data), nil
	case "message_start":
		if e.Message == nil {
			return nil, errors.New("message_start without a message")
		}
		s.usage(e.Message.Usage)
	case "content_block_start":
		if e.ContentBlock == nil {
			return nil, errors.New("content_block_start without a content block")
		}
		return nil, s.blockStart(e.Index, e.ContentBlock)
	case "content_block_delta":
		if e.Delta == nil {
			return nil, errors.New("content_block_delta without a delta")
		}
		return nil, s.blockDelta(e.Index, e.Delta.Type, e.Delta.Text, e.Delta.PartialJSON, e.Delta.Thinking)
	case "content_block_stop":
		return nil, s.blockStop(e.Index)
	case "message_delta":
		if e.Delta != nil && e.Delta.StopReason != nil && *e.Delta.StopReason != "" {
			s.acc.finish = FinishReason(*e.Delta.StopReason)
		}
		if e.Usage != nil {
			s.usage(*e.Usage)
			s.finalUsage = s.finalUsage || e.Usage.OutputTokens != nil
		}
	case "message_stop":
		s.acc.done = true
		s.stopped = true
	}
	// ping, and event types added to the API later, carry nothing to read.
	return nil, nil
}

// ended reports that message_stop arrived.
func (s *messageStream) ended() bool { return s.stopped }

func (s *messageStream) usage(u messagesUsage) {
	if n, ok := u.input(); ok {
		s.inputTokens, s.sawInput = n, true
	}
	if u.OutputTokens != nil {
		s.outputTokens = *u.OutputTokens
	}
}

// blockStart opens a content block: text is delivered as it comes, a
// tool_use becomes the first fragment of an OpenAI tool call; thinking and
// server-side blocks are not part of the answer. A tool call, a server
// tool's call and thinking that arrives whole are the model's output, so
// their start is a first token; an empty text or thinking block's start
// is not.
func (s *messageStream) blockStart(index int, b *messagesBlock) error {
	switch b.Type {
	case "text":
		s.text(b.Text)
	case "tool_use":
		n := len(s.tools)
		s.tools[index] = n
		args := ""
		if in := bytes.TrimSpace(b.Input); len(in) > 0 && !bytes.Equal(in, []byte("{}")) && !isNull(in) {
			args = string(in) // a block sent whole rather than streamed
			s.toolArgs[n] = true
		}
		return s.toolFragment(toolCallFragment{Index: n, ID: b.ID, Type: "function",
			Function: toolCallFunctionFragment{Name: b.Name, Arguments: args}})
	case "server_tool_use":
		s.acc.firstToken()
	case "thinking":
		if b.Thinking != "" {
			s.acc.firstToken()
		}
	case "redacted_thinking":
		if b.Data != "" {
			s.acc.firstToken()
		}
	}
	return nil
}

func (s *messageStream) blockDelta(index int, typ, text, partialJSON, thinking string) error {
	switch typ {
	case "text_delta":
		s.text(text)
	case "input_json_delta":
		n, ok := s.tools[index]
		if !ok {
			return fmt.Errorf("input_json_delta for content block %d, which is no tool_use", index)
		}
		if partialJSON == "" {
			return nil // not output; the block's start was
		}
		s.toolArgs[n] = true
		return s.toolFragment(toolCallFragment{Index: n, Function: toolCallFunctionFragment{Arguments: partialJSON}})
	case "thinking_delta":
		if thinking != "" {
			s.acc.firstToken()
			s.acc.tokens++ // billed output, never delivered
		}
	}
	return nil
}

// blockStop completes a tool call that streamed no arguments with "{}", so
// that its arguments are a JSON object as OpenAI's always are.
func (s *messageStream) blockStop(index int) error {
	n, ok := s.tools[index]
	if !ok || s.toolArgs[n] {
		return nil
	}
	s.toolArgs[n] = true
	raw, err := json.Marshal([]toolCallFragment{{Index: n, Function: toolCallFunctionFragment{Arguments: "{}"}}})
	if err != nil {
		return fmt.Errorf("encode tool-call fragment: %w", err)
	}
	// Part of the call already counted; not a token of its own.
	if _, err := s.acc.mergeToolCalls(raw); err != nil {
		return err
	}
	s.acc.sink.Delta(Delta{ToolCalls: raw})
	return nil
}

func (s *messageStream) text(t string) {
	if t == "" {
		return
	}
	s.acc.firstToken()
	s.acc.content.WriteString(t)
	s.acc.tokens++
	s.acc.sink.Delta(Delta{Content: t, Tokens: 1})
}

// toolCallFragment is a tool-call delta in OpenAI's streaming shape: the
// first fragment of a call names it, later ones add argument text.
type toolCallFragment struct {
	Index    int                      `json:"index"`
	ID       string                   `json:"id,omitempty"`
	Type     string                   `json:"type,omitempty"`
	Function toolCallFunctionFragment `json:"function"`
}

type toolCallFunctionFragment struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

func (s *messageStream) toolFragment(f toolCallFragment) error {
	raw, err := json.Marshal([]toolCallFragment{f})
	if err != nil {
		return fmt.Errorf("encode tool-call fragment: %w", err)
	}
	if _, err := s.acc.mergeToolCalls(raw); err != nil {
		return err
	}
	s.acc.firstToken()
	s.acc.tokens++
	s.acc.sink.Delta(Delta{ToolCalls: raw, Tokens: 1})
	return nil
}

// outcome is the attempt's result so far. Usage is the provider's when a
// message_delta reported it; otherwise it is estimated from what was
// reported or counted, never less than either.
func (s *messageStream) progress() int64 { return s.acc.progress() }

func (s *messageStream) outcome() Outcome {
	out := s.acc.outcome()
	switch {
	case s.finalUsage && s.sawInput:
		out.Usage = schemas.Usage{InputUnits: s.inputTokens, OutputUnits: s.outputTokens}
	default:
		out.Usage = schemas.Usage{InputUnits: s.acc.inputEstimate, OutputUnits: max(s.outputTokens, s.acc.tokens), Estimated: true}
		if s.sawInput {
			out.Usage.InputUnits = s.inputTokens
		}
	}
	return out
}
