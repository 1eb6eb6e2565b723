package schemas

import (
	"encoding/json"
	"time"
)

// sample pairs the smallest valid value of a kind with a fully populated one.
// Every kind in Kinds() must have one (TestEveryKindHasASchemaFileAndASample).
type sample struct {
	kind    string
	minimal kinded
	full    kinded
}

type kinded interface{ Kind() string }

var eventTime = time.Date(2026, 7, 31, 0, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

func minimalChatRequest() ChatRequest {
	return ChatRequest{Messages: []Message{{Role: MessageUser, Content: TextContent("hi")}}}
}

func fullChatRequest() ChatRequest {
	return ChatRequest{
		Model: "gpt-4o",
		Messages: []Message{
			{Role: MessageSystem, Content: TextContent("You answer briefly.")},
			{Role: MessageUser, Content: json.RawMessage(`[{"type":"text","text":"What is in this image?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]`)},
			{Role: MessageAssistant, ToolCalls: json.RawMessage(`[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"x\"}"}}]`)},
			{Role: MessageTool, ToolCallID: "call_1", Content: TextContent(`{"result":"a cat"}`)},
			{Role: MessageUser, Name: "reviewer", Content: TextContent("Thanks.")},
		},
		MaxTokens:         512,
		Temperature:       ptr(0.2),
		TopP:              ptr(0.9),
		PresencePenalty:   ptr(0.0),
		FrequencyPenalty:  ptr(-0.5),
		Seed:              ptr(int64(7)),
		Stop:              []string{"\n\n", "END"},
		Tools:             json.RawMessage(`[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]`),
		ToolChoice:        json.RawMessage(`"auto"`),
		ResponseFormat:    json.RawMessage(`{"type":"json_object"}`),
		ParallelToolCalls: ptr(false),
		Stream:            true,
		MaxTokensField:    ParamMaxCompletionTokens,
		Dialect:           DialectOpenAI,
		Extra: map[string]json.RawMessage{
			"logit_bias": json.RawMessage(`{"50256":-100}`), "user": json.RawMessage(`"user-1"`),
			"reasoning_effort": json.RawMessage(`"low"`), "x_vendor_option": json.RawMessage(`[1,{"a":null}]`),
		},
	}
}

func samples() []sample {
	gate := &GateValue{GroupID: "hg_042", Attempt: 2, Epoch: 3}
	return []sample{
		{KindChatRequest, minimalChatRequest(), fullChatRequest()},
		{
			KindAttempt,
			Attempt{Secret: "0123456789abcdef0123456789abcdef", GroupID: "g1", UserActionID: "ua_1", Attempt: 1, Role: RolePrimary, Route: "r1",
				OperationClass: "chat", ModelClass: "general", DeadlineUnixMs: 1, RemainingMs: 1,
				CommitPoint: Complete, ReplyInbox: "_INBOX.a", Request: minimalChatRequest()},
			Attempt{Secret: "9f86d081884c7d659a2feaa0c55ad015", V: Version, GroupID: "hg_042", UserActionID: "ua_6f1c2a", Attempt: 2, Role: RoleContinuation,
				Route: "openai-east", OperationClass: "summarize", ModelClass: "gpt4o",
				DeadlineUnixMs: eventTime.UnixMilli() + 8000, RemainingMs: 6600,
				CommitPoint: CommitPoint{Kind: CommitTokens, Tokens: 16}, ReplyInbox: "_INBOX.Jx3.hg_042.2",
				Request: fullChatRequest(), StallAfterFirstTokenMs: 2000,
				Continuation: &Continuation{Text: "The answer so far, ", OffsetTokens: 5}},
		},
		{
			KindAccept,
			Accept{Secret: "0123456789abcdef0123456789abcdef", GroupID: "g1", Attempt: 1, WorkerID: "w1", ControlInbox: "_INBOX.c"},
			Accept{Secret: "9f86d081884c7d659a2feaa0c55ad015", V: Version, GroupID: "hg_042", Attempt: 2, WorkerID: "worker-7f3a", ControlInbox: "_INBOX.ctl.worker-7f3a"},
		},
		{
			KindBusy,
			Busy{Secret: "0123456789abcdef0123456789abcdef", GroupID: "g1", Attempt: 1, WorkerID: "w1"},
			Busy{Secret: "9f86d081884c7d659a2feaa0c55ad015", V: Version, GroupID: "hg_042", Attempt: 2, WorkerID: "worker-7f3a"},
		},
		{
			KindHeartbeat,
			Heartbeat{Secret: "0123456789abcdef0123456789abcdef", WorkerID: "w1", GroupID: "g1", Attempt: 1, Seq: 1},
			Heartbeat{Secret: "9f86d081884c7d659a2feaa0c55ad015", WorkerID: "worker-7f3a", V: Version, GroupID: "hg_042", Attempt: 2, Seq: 9},
		},
		{
			KindFirstByte,
			FirstByte{Secret: "0123456789abcdef0123456789abcdef", WorkerID: "w1", GroupID: "g1", Attempt: 1},
			FirstByte{Secret: "9f86d081884c7d659a2feaa0c55ad015", WorkerID: "worker-7f3a", V: Version, GroupID: "hg_042", Attempt: 2, ElapsedMs: 1190},
		},
		{
			KindChunk,
			Chunk{Secret: "0123456789abcdef0123456789abcdef", WorkerID: "w1", GroupID: "g1", Attempt: 1, Seq: 1},
			Chunk{Secret: "9f86d081884c7d659a2feaa0c55ad015", WorkerID: "worker-7f3a", V: Version, GroupID: "hg_042", Attempt: 2, Seq: 1, Delta: "The image shows",
				ToolCalls: json.RawMessage(`[{"index":0,"function":{"arguments":"{\"q\""}}]`),
				Tokens:    16, CumulativeTokens: 16, First: true},
		},
		{
			KindAttemptResult,
			AttemptResult{Secret: "0123456789abcdef0123456789abcdef", GroupID: "g1", Attempt: 1, WorkerID: "w1", StatusClass: StatusNoResponders, ErrorScope: ScopeTransient},
			AttemptResult{Secret: "9f86d081884c7d659a2feaa0c55ad015", V: Version, GroupID: "hg_042", Attempt: 2, WorkerID: "worker-7f3a",
				StatusClass: StatusRateLimited, ErrorScope: ScopePushback, HTTPStatus: 429, RetryAfterMs: 2000,
				FinishReason: "stop", Content: "A cat.", ToolCalls: json.RawMessage(`[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{}"}}]`),
				LastSeq: 12, Usage: Usage{InputUnits: 480, OutputUnits: 12, Estimated: true},
				FirstByteMs: ptr(int64(1190)), ElapsedMs: 2670, CancellationObserved: true, MaxTokenGapMs: 180,
				ErrorMessage: SanitizeMessage("rate limit reached for requests")},
		},
		{
			KindCancel,
			Cancel{Secret: "0123456789abcdef0123456789abcdef", GroupID: "g1", Attempt: 1, Reason: CancelDeadline},
			Cancel{Secret: "9f86d081884c7d659a2feaa0c55ad015", V: Version, GroupID: "hg_042", Attempt: 1, Reason: CancelLostRace},
		},
		{
			KindSubmitRequest,
			SubmitRequest{OperationClass: "chat", ModelClass: "general", Request: minimalChatRequest()},
			SubmitRequest{V: Version, OperationClass: "summarize", ModelClass: "gpt4o",
				IdempotencyKey: "order-2291-summary", DeadlineMs: 8000, Request: fullChatRequest()},
		},
		{
			KindSubmitResponse,
			SubmitResponse{UserActionID: "ua_1", GroupID: "g1", Error: &SubmitError{Code: ErrNoRoute, Message: "no healthy route"}},
			SubmitResponse{V: Version, UserActionID: "ua_6f1c2a", GroupID: "hg_042", Content: "A cat.",
				ToolCalls: json.RawMessage(`[]`), FinishReason: "stop",
				Usage: Usage{InputUnits: 480, OutputUnits: 40}, TotalUsage: Usage{InputUnits: 960, OutputUnits: 52, Estimated: true},
				Attempts: 2, Hedged: true, WinnerAttempt: 2, WinnerRoute: "anthropic-west", Gate: gate},
		},
		{
			KindSubmitChunk,
			SubmitChunk{Seq: 1},
			SubmitChunk{V: Version, Seq: 7, Delta: "A cat.",
				ToolCalls: json.RawMessage(`[{"index":0,"id":"call_1","type":"function","function":{"name":"lookup","arguments":""}}]`)},
		},
		{
			KindAttemptRecord,
			AttemptRecord{EventTime: eventTime, Reporter: ReporterWorker, UserActionID: "ua_1", HedgeGroupID: "g1",
				Attempt: 1, Role: RolePrimary, Route: "r1", RouteClass: "chat_equivalent", OperationClass: "chat",
				ModelClass: "general", CommitPoint: FirstToken, Outcome: OutcomeFailed, StatusClass: StatusLost,
				ErrorScope: ScopeTransient, CostBand: CostLow, PromptFingerprint: "0123456789abcdef"},
			AttemptRecord{V: Version, Event: EventAttemptComplete, EventTime: eventTime, Reporter: ReporterDispatcher,
				UserActionID: "ua_042", HedgeGroupID: "hg_042", Attempt: 2, Role: RoleHedge, Route: "openai-east",
				RouteClass: "chat_equivalent", OperationClass: "summarize", ModelClass: "general", CommitPoint: FirstToken,
				WorkerID: "worker-7f3a", Region: "eu-west", HedgeDelayMs: ptr(int64(1400)), OverallDeadlineMs: 8000, ElapsedMs: 2670,
				FirstByteMs: ptr(int64(1190)), Outcome: OutcomeLoserCanceled, StatusClass: StatusCanceled,
				ErrorScope: ScopeNone, HTTPStatus: 200, ContractValid: false, CancellationSent: true,
				CancellationObserved: true, UsageInputUnits: 480, UsageOutputUnits: 12, UsageEstimated: true,
				CostBand: CostLow, DuplicateRateWindow: 0.03, PromptFingerprint: PromptFingerprint([]byte("k"), []byte("p"))},
		},
		{
			KindGroupRecord,
			GroupRecord{EventTime: eventTime, Reporter: ReporterDispatcher, UserActionID: "ua_1", HedgeGroupID: "g1",
				RouteClass: "chat_equivalent", OperationClass: "chat", ModelClass: "general", CommitPoint: Complete,
				Outcome: GroupFailed, StatusClass: StatusTimeout, ErrorCode: ErrDeadlineExceeded, ErrorScope: ScopeTransient,
				CostBand: CostLow, PromptFingerprint: "0123456789abcdef", GuardrailDecision: GuardrailIneligible},
			GroupRecord{V: Version, Event: EventGroupComplete, EventTime: eventTime, Reporter: ReporterSimulator,
				UserActionID: "ua_042", HedgeGroupID: "hg_042", RouteClass: "chat_equivalent", OperationClass: "summarize",
				ModelClass: "general", CommitPoint: FirstToken, Stream: true, Region: "eu-west", HedgeDelayMs: ptr(int64(1400)),
				OverallDeadlineMs: 8000, ElapsedMs: 2710, FirstByteMs: ptr(int64(1650)),
				CommittedUnixMs: eventTime.UnixMilli() - 5, Outcome: GroupCommitted, StatusClass: StatusOK,
				ErrorScope: ScopeNone, Attempts: 2, HedgeLaunched: true,
				HedgeSuppressedReason: "", WinnerAttempt: 2, WinnerRole: RoleHedge, WinnerRoute: "anthropic-west",
				GateEpoch: 3, LoserFinishedLate: true, UsageInputUnits: 960, UsageOutputUnits: 52, UsageEstimated: true,
				CostBand: CostMedium, DuplicateRateWindow: 0.05, PromptFingerprint: "fedcba9876543210",
				GuardrailDecision: GuardrailAllow, Supersedes: "hg_041"},
		},
		{
			KindSupersededRecord,
			SupersededRecord{EventTime: eventTime, Reporter: ReporterDispatcher, UserActionID: "ua_1", HedgeGroupID: "g1",
				WinnerAttempt: 1, GateEpoch: 1, SupersededBy: "g2"},
			SupersededRecord{V: Version, Event: EventGroupSuperseded, EventTime: eventTime, Reporter: ReporterDispatcher,
				UserActionID: "ua_042", HedgeGroupID: "deaddeadbeef-7", WinnerAttempt: 2, GateEpoch: 3,
				SupersededBy: "0123456789ab-12"},
		},
	}
}
