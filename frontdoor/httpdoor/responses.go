package httpdoor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// This file holds the OpenAI Responses dialect of the HTTP front door
// (POST /v1/responses): the response object and its semantic event stream.
// Errors are OpenAI error objects; a stream that fails after its first
// byte ends with an "error" event.

// responsesDialect speaks OpenAI's Responses API.
type responsesDialect struct{}

var _ dialect = responsesDialect{}

func (responsesDialect) parse(body []byte) (string, schemas.ChatRequest, bool, *frontdoor.Failure) {
	pool, req, f := parseResponsesRequest(body)
	return pool, req, false, f
}

func (responsesDialect) answer(resp *dispatcher.Response, pool string, now time.Time) any {
	id := responseID(resp.GroupID)
	return newResponseObject(resp, id, pool, now.Unix(), answerItems(resp, id))
}

func (responsesDialect) stream(w http.ResponseWriter, pool string, now time.Time, _ bool) stream {
	return &responseStream{sseWriter: newSSEWriter(w), model: pool, created: now.Unix()}
}

func (responsesDialect) writeFailure(w http.ResponseWriter, f *frontdoor.Failure) {
	openAIDialect{}.writeFailure(w, f)
}

// formatParam renames the chat parameter of a response_format refusal to
// the Responses member it came from.
func (responsesDialect) formatParam(f *frontdoor.Failure) *frontdoor.Failure {
	if f != nil && strings.HasPrefix(f.Param, "response_format") {
		f.Param = "text.format" + strings.TrimPrefix(strings.TrimPrefix(f.Param, "response_format"), ".json_schema")
		f.Message = strings.ReplaceAll(f.Message, "'response_format.json_schema.schema'", "'text.format.schema'")
	}
	return f
}

// responseID names a response after its hedge group, as completionID does.
func responseID(groupID string) string {
	if groupID == "" {
		groupID = randomID()
	}
	return "resp_" + groupID
}

// responseObject is the Responses API's response object, with the members
// hedgerow knows; what the caller asked for (tools, temperature...) is not
// echoed back.
type responseObject struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	CreatedAt         int64              `json:"created_at"`
	Status            string             `json:"status"`
	Error             *json.RawMessage   `json:"error"`
	IncompleteDetails *incompleteDetails `json:"incomplete_details"`
	Model             string             `json:"model"`
	Output            []any              `json:"output"`
	Usage             *responsesUsage    `json:"usage"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type responsesUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

// messageItem is an output message item.
type messageItem struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputPart `json:"content"`
}

// outputPart is an output_text content part.
type outputPart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

func newOutputPart(text string) outputPart {
	return outputPart{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}
}

// functionCallItem is an output function_call item.
type functionCallItem struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	Status    string `json:"status"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// newResponseObject is the response of the winner's answer with output;
// status completed, or incomplete when the output was cut short.
func newResponseObject(resp *dispatcher.Response, id, pool string, created int64, output []any) responseObject {
	o := responseObject{ID: id, Object: "response", CreatedAt: created, Status: "completed", Model: pool, Output: output}
	switch finishReason(resp) {
	case "length":
		o.Status, o.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "max_output_tokens"}
	case "content_filter":
		o.Status, o.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "content_filter"}
	}
	u := &responsesUsage{InputTokens: resp.Usage.InputUnits, OutputTokens: resp.Usage.OutputUnits,
		TotalTokens: resp.Usage.InputUnits + resp.Usage.OutputUnits}
	o.Usage = u
	if o.Output == nil {
		o.Output = []any{}
	}
	return o
}

// itemStatus is the status of the output items of a finished response.
func itemStatus(resp *dispatcher.Response) string {
	if r := finishReason(resp); r == "length" || r == "content_filter" {
		return "incomplete"
	}
	return "completed"
}

// outputMessageID and callItemID name output items after their response.
func outputMessageID(respID string) string { return "msg_" + strings.TrimPrefix(respID, "resp_") }
func callItemID(respID string, i int) string {
	return "fc_" + strings.TrimPrefix(respID, "resp_") + "_" + strconv.Itoa(i)
}

// answerItems is the output of a non-streaming answer: its text as one
// message, then its tool calls as function_call items.
func answerItems(resp *dispatcher.Response, respID string) []any {
	status := itemStatus(resp)
	var out []any
	if resp.Content != "" {
		out = append(out, messageItem{Type: "message", ID: outputMessageID(respID), Status: status, Role: "assistant",
			Content: []outputPart{newOutputPart(resp.Content)}})
	}
	if raw := validRaw(resp.ToolCalls); raw != nil {
		var calls []chatToolCall
		if json.Unmarshal(raw, &calls) == nil {
			for i, c := range calls {
				out = append(out, functionCallItem{Type: "function_call", ID: callItemID(respID, i), Status: status,
					CallID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			}
		}
	}
	return out
}

// responseStream writes a streaming response as the Responses API's
// semantic events. response.created and response.in_progress go out with
// the first committed delta, as every byte of a stream does: they are not
// a first token. Text opens a message item, each tool call a function_call
// item; all are closed, in output order, when the stream finishes.
type responseStream struct {
	sseWriter
	model   string
	created int64
	id      string
	seq     int64
	items   []*streamItem
	message *streamItem         // the open message item, if any
	calls   map[int]*streamItem // function_call items by chat tool-call index
}

// streamItem is an output item of the stream, and what it has received.
type streamItem struct {
	index        int
	id           string
	call         bool
	callID, name string
	text         strings.Builder // the message's text or the call's arguments
}

var _ dispatcher.CommitSink = (*responseStream)(nil)

// emit writes one event named after its type, numbered in sequence.
func (s *responseStream) emit(ev map[string]any) error {
	ev["sequence_number"] = s.seq
	s.seq++
	return s.event(ev["type"].(string), ev)
}

// start sends the status line, the headers, response.created and
// response.in_progress, once.
func (s *responseStream) start() error {
	first, group, err := s.begin()
	if !first || err != nil {
		return err
	}
	s.id = responseID(group)
	pending := responseObject{ID: s.id, Object: "response", CreatedAt: s.created, Status: "in_progress", Model: s.model, Output: []any{}}
	if err := s.emit(map[string]any{"type": "response.created", "response": pending}); err != nil {
		return err
	}
	return s.emit(map[string]any{"type": "response.in_progress", "response": pending})
}

// Delta writes one piece of the committed stream.
func (s *responseStream) Delta(d dispatcher.Delta) error {
	if d.Content == "" && validRaw(d.ToolCalls) == nil {
		return nil
	}
	if err := s.start(); err != nil {
		return err
	}
	if d.Content != "" {
		if err := s.text(d.Content); err != nil {
			return err
		}
	}
	if raw := validRaw(d.ToolCalls); raw != nil {
		var calls []struct {
			Index    int    `json:"index"`
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		if err := json.Unmarshal(raw, &calls); err != nil {
			return nil // not a tool-call delta the worker would send; nothing to show
		}
		for _, c := range calls {
			if err := s.toolCall(c.Index, c.ID, c.Function.Name, c.Function.Arguments); err != nil {
				return err
			}
		}
	}
	return nil
}

// text writes a text delta, opening the message item first.
func (s *responseStream) text(delta string) error {
	if s.message == nil {
		s.message = &streamItem{index: len(s.items), id: outputMessageID(s.id)}
		s.items = append(s.items, s.message)
		if err := s.emit(map[string]any{"type": "response.output_item.added", "output_index": s.message.index,
			"item": messageItem{Type: "message", ID: s.message.id, Status: "in_progress", Role: "assistant", Content: []outputPart{}}}); err != nil {
			return err
		}
		if err := s.emit(map[string]any{"type": "response.content_part.added", "item_id": s.message.id,
			"output_index": s.message.index, "content_index": 0, "part": newOutputPart("")}); err != nil {
			return err
		}
	}
	s.message.text.WriteString(delta)
	return s.emit(map[string]any{"type": "response.output_text.delta", "item_id": s.message.id,
		"output_index": s.message.index, "content_index": 0, "delta": delta, "logprobs": []any{}})
}

// toolCall writes a piece of tool call index, opening its function_call
// item first.
func (s *responseStream) toolCall(index int, callID, name, args string) error {
	it := s.calls[index]
	if it == nil {
		if s.calls == nil {
			s.calls = make(map[int]*streamItem)
		}
		it = &streamItem{index: len(s.items), id: callItemID(s.id, index), call: true, callID: callID, name: name}
		s.calls[index] = it
		s.items = append(s.items, it)
		if err := s.emit(map[string]any{"type": "response.output_item.added", "output_index": it.index,
			"item": functionCallItem{Type: "function_call", ID: it.id, Status: "in_progress", CallID: callID, Name: name}}); err != nil {
			return err
		}
	}
	if args == "" {
		return nil
	}
	it.text.WriteString(args)
	return s.emit(map[string]any{"type": "response.function_call_arguments.delta", "item_id": it.id,
		"output_index": it.index, "delta": args})
}

// finish ends a successful stream: every open item done, in output order,
// then response.completed (response.incomplete when the output was cut
// short) with the usage, and the hedge trailers.
func (s *responseStream) finish(resp *dispatcher.Response) error {
	s.Committed(resp) // an empty answer: nothing was sent yet
	if err := s.start(); err != nil {
		return err
	}
	status := itemStatus(resp)
	output := make([]any, 0, len(s.items))
	for _, it := range s.items {
		var item any
		if it.call {
			fc := functionCallItem{Type: "function_call", ID: it.id, Status: status, CallID: it.callID, Name: it.name, Arguments: it.text.String()}
			if err := s.emit(map[string]any{"type": "response.function_call_arguments.done", "item_id": it.id,
				"output_index": it.index, "name": it.name, "arguments": fc.Arguments}); err != nil {
				return err
			}
			item = fc
		} else {
			part := newOutputPart(it.text.String())
			if err := s.emit(map[string]any{"type": "response.output_text.done", "item_id": it.id,
				"output_index": it.index, "content_index": 0, "text": part.Text, "logprobs": []any{}}); err != nil {
				return err
			}
			if err := s.emit(map[string]any{"type": "response.content_part.done", "item_id": it.id,
				"output_index": it.index, "content_index": 0, "part": part}); err != nil {
				return err
			}
			item = messageItem{Type: "message", ID: it.id, Status: status, Role: "assistant", Content: []outputPart{part}}
		}
		if err := s.emit(map[string]any{"type": "response.output_item.done", "output_index": it.index, "item": item}); err != nil {
			return err
		}
		output = append(output, item)
	}
	final := newResponseObject(resp, s.id, s.model, s.created, output)
	event := "response.completed"
	if final.Status == "incomplete" {
		event = "response.incomplete"
	}
	if err := s.emit(map[string]any{"type": event, "response": final}); err != nil {
		return err
	}
	s.end(resp)
	return nil
}

// fail ends a stream whose bytes already reached the caller with an error
// event, so no client takes it for a whole response.
func (s *responseStream) fail(f *frontdoor.Failure) error {
	ev := map[string]any{"type": "error", "message": f.Message, "code": nil, "param": nil}
	if f.Code != "" {
		ev["code"] = f.Code
	}
	if f.Param != "" {
		ev["param"] = f.Param
	}
	if err := s.emit(ev); err != nil {
		return fmt.Errorf("write error event: %w", err)
	}
	return nil
}
