package schemas

// The names of the wire (docs/architecture.md §8): every NATS subject,
// queue group, micro service and inbox prefix two processes must agree on
// is defined in this package and read from here by the dispatcher, the
// workers, the doors and the generated NATS permissions
// (docs/architecture.md §13), never copied. The submit door's subjects
// (SubmitSubject, SubmitServiceName, the cancel subjects) are beside its
// framing in submit_stream.go; the records stream's (StoredRecordPrefix) in
// record.go.

// Attempts: a dispatcher publishes each attempt on AttemptSubject(route),
// with its reply inbox as the reply subject; the route's workers subscribe
// to it in the queue group WorkerQueueGroup(route), so each attempt reaches
// one of them.
const AttemptSubjectPrefix = "hedgerow.attempt."

// AttemptSubject is the subject a route's attempts are published on.
func AttemptSubject(route string) string { return AttemptSubjectPrefix + route }

// WorkerQueueGroup is the queue group of a route's workers on
// AttemptSubject(route); the generated permissions let a worker subscribe
// to a route's attempts only in it.
func WorkerQueueGroup(route string) string { return "hedgerow-worker-" + route }

// Micro services and queue groups.
const (
	// WorkerServiceName is the NATS micro service every worker registers,
	// with its route in the metadata; a gateway's readiness check pings it
	// ($SRV.PING.hedgerow-worker).
	WorkerServiceName = "hedgerow-worker"
	// SubmitQueueGroup is the queue group of the submit endpoint
	// (SubmitSubject) the gateways serve: each request goes to one replica.
	SubmitQueueGroup = "hedgerow-gateway"
)

// The live records (docs/architecture.md §9): core NATS publishes, which
// observers read under LiveRecordPrefix.
const (
	// LiveRecordPrefix heads the live records' subjects.
	LiveRecordPrefix = "hedgerow.events."
	// AttemptRecordSubject carries the AttemptRecords: each worker's own
	// report of its attempts and the dispatcher's record of each attempt.
	AttemptRecordSubject = LiveRecordPrefix + "attempt"
	// GroupRecordSubject carries the dispatchers' GroupRecords.
	GroupRecordSubject = LiveRecordPrefix + "group"
)

// Inbox prefixes of the roles' connections (nats.CustomInboxPrefix). Every
// connection a hedgerow process opens keeps its inboxes under its role's
// prefix, with or without authentication, and the generated permissions let
// each role subscribe only under its own (docs/architecture.md §8, §13).
const (
	// GatewayInboxPrefix holds the dispatchers' reply inboxes (an attempt's
	// <prefix>.<nuid>.<group token>.<attempt>, where its worker answers),
	// the NATS door's probes and the readiness pings' inboxes.
	GatewayInboxPrefix = "_INBOX.gw"
	// WorkerInboxPrefix holds the workers' control inboxes, named in each
	// Accept, where gateways send Cancels.
	WorkerInboxPrefix = "_INBOX.wk"
	// ClientInboxPrefix starts the inbox prefix of each NATS client user,
	// ClientInbox(user): the generated permissions let a client user read
	// only its own, so the gateway reads the user owning a request from its
	// reply subject (ClientInboxUser).
	ClientInboxPrefix = "_INBOX.cl"
	// ObserverInboxPrefix holds the observers' inboxes, where the records
	// stream's answers and messages reach them.
	ObserverInboxPrefix = "_INBOX.ob"
)

// ClientInbox is the inbox prefix client user must connect with
// (nats.CustomInboxPrefix): the only subjects it may subscribe to.
func ClientInbox(user string) string { return ClientInboxPrefix + "." + user }
