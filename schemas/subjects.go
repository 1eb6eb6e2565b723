package schemas

import "strings"

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

// Wire is the wire of one region of a supercluster (docs/architecture.md
// §8, §14): every subject, queue group and micro service name a region's
// dispatchers, workers, doors and observers meet on carries the region, so
// that NATS, which routes a message to any interested subscriber in any
// cluster of a supercluster and lets a queue group spill to another
// cluster's members when it has none at home, never hands one region's
// attempts, submits, pings or records to another's processes. The zero
// Wire (no region) is the wire of a deployment of one region: the package's
// names above, byte for byte. Inbox prefixes are not regional: an inbox is
// drawn at random and answered only by the one who was sent it.
//
// A region's subjects are today's with the region as their second token
// (hedgerow.<region>.attempt.<route>, hedgerow.<region>.submit, …); its
// micro services' names end in _<region> (hedgerow_<region>,
// hedgerow-worker_<region>: the gateways' start hedgerow_, the workers'
// hedgerow-, so no region's name of one is any region's of the other); its
// queue groups end in _<region> too.
type Wire struct {
	// Region is a token of [a-z0-9_-] (config's deployment.region), or
	// empty for a deployment of one region.
	Region string
}

// RegionWire is the wire of region ("" for a deployment of one region).
func RegionWire(region string) Wire { return Wire{Region: region} }

// root heads every subject of the wire.
func (w Wire) root() string {
	if w.Region == "" {
		return "hedgerow."
	}
	return "hedgerow." + w.Region + "."
}

// service is a micro service's or queue group's name in the region.
func (w Wire) service(name string) string {
	if w.Region == "" {
		return name
	}
	return name + "_" + w.Region
}

// AttemptSubjectPrefix heads the region's attempt subjects.
func (w Wire) AttemptSubjectPrefix() string { return w.root() + "attempt." }

// AttemptSubject is the subject a route's attempts are published on in the
// region: only the region's workers of the route subscribe to it.
func (w Wire) AttemptSubject(route string) string { return w.AttemptSubjectPrefix() + route }

// WorkerQueueGroup is the queue group of the region's workers of a route.
func (w Wire) WorkerQueueGroup(route string) string {
	return w.service("hedgerow-worker-" + route)
}

// WorkerServiceName is the micro service the region's workers register and
// its gateways' readiness checks ping.
func (w Wire) WorkerServiceName() string { return w.service(WorkerServiceName) }

// SubmitServiceName is the micro service the region's gateways register
// and its clients ping to find them.
func (w Wire) SubmitServiceName() string { return w.service(SubmitServiceName) }

// SubmitSubject is the subject the region's gateways answer submits on.
func (w Wire) SubmitSubject() string { return w.root() + "submit" }

// SubmitQueueGroup is the queue group of the region's gateways on
// SubmitSubject.
func (w Wire) SubmitQueueGroup() string { return w.service(SubmitQueueGroup) }

// SubmitCancelPrefix heads the region's cancel subjects.
func (w Wire) SubmitCancelPrefix() string { return w.root() + "submit.cancel." }

// SubmitCancelUserPrefix is followed by the request ids of user's cancels
// in the region.
func (w Wire) SubmitCancelUserPrefix(user string) string {
	return w.SubmitCancelPrefix() + user + "."
}

// SubmitCancelSubjectFor is the subject that cancels, in the region, the
// request with this id sent with reply inbox inbox (SubmitCancelSubjectFor).
func (w Wire) SubmitCancelSubjectFor(inbox, id string) string {
	if user, ok := ClientInboxUser(inbox); ok {
		return w.SubmitCancelUserPrefix(user) + id
	}
	return w.SubmitCancelPrefix() + id
}

// ParseSubmitCancelSubject reads a cancel subject of the region
// (ParseSubmitCancelSubject).
func (w Wire) ParseSubmitCancelSubject(subject string) (user, id string, err error) {
	return parseSubmitCancel(w.SubmitCancelPrefix(), subject)
}

// LiveRecordPrefix heads the region's live records' subjects: an observer
// of one region subscribes under it, one of every region under
// LiveRecordPrefix's region-less root hedgerow.*.events.>.
func (w Wire) LiveRecordPrefix() string { return w.root() + "events." }

// AttemptRecordSubject carries the region's AttemptRecords.
func (w Wire) AttemptRecordSubject() string { return w.LiveRecordPrefix() + "attempt" }

// GroupRecordSubject carries the region's GroupRecords.
func (w Wire) GroupRecordSubject() string { return w.LiveRecordPrefix() + "group" }

// StoredRecordPrefix heads the subjects the region's records stream keeps
// (StoredRecordPrefix, in record.go, is the zero Wire's): two regions'
// streams in one supercluster's JetStream must not capture the same
// subjects, which JetStream refuses anyway.
func (w Wire) StoredRecordPrefix() string { return w.root() + "records." }

// StoredSubject is the subject a record the dispatcher names by the zero
// Wire's stored subject (StoredGroupSubject, StoredAttemptSubject,
// StoredSupersededSubject) is kept on in the region; a subject not under
// StoredRecordPrefix is returned as it is.
func (w Wire) StoredSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, StoredRecordPrefix)
	if !ok || w.Region == "" {
		return subject
	}
	return w.StoredRecordPrefix() + rest
}

// JetStreamName is a stream's or bucket's default name in the region,
// name_<region> (hedgerow_records_east), so that the regions' records
// streams and gate buckets do not collide in the supercluster's one
// JetStream; name itself without a region.
func (w Wire) JetStreamName(name string) string {
	if w.Region == "" {
		return name
	}
	return name + "_" + w.Region
}

// ActionPrefix heads the subjects of the region's index of committed user
// actions, which its actions stream keeps and the other regions source
// (docs/architecture.md §14, "User actions across regions").
func (w Wire) ActionPrefix() string { return w.root() + "actions." }

// ActionSubject carries the region's entry of one committed user action,
// by its replay key (a hex hash: never the caller's key or tenant).
func (w Wire) ActionSubject(key string) string { return w.ActionPrefix() + "key." + key }

// ActionHeartbeatSubject carries the region's heartbeat in its actions
// stream: the other regions judge by its arrival how long ago they last
// heard from the region.
func (w Wire) ActionHeartbeatSubject() string { return w.ActionPrefix() + "heartbeat" }

// AnyRegionActionSubject matches every region's entry of the user action
// key (hedgerow.*.actions.key.<key>).
func AnyRegionActionSubject(key string) string { return "hedgerow.*.actions.key." + key }
