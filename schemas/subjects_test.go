package schemas

import "testing"

// The wire's names are what processes of two releases meet on during a
// rolling update (docs/architecture.md §8): they are pinned here, literally.
func TestTheWiresNamesAreTheDocumentedOnes(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{AttemptSubject("fake-a"), "hedgerow.attempt.fake-a"},
		{WorkerQueueGroup("fake-a"), "hedgerow-worker-fake-a"},
		{WorkerServiceName, "hedgerow-worker"},
		{SubmitServiceName, "hedgerow"},
		{SubmitSubject, "hedgerow.submit"},
		{SubmitQueueGroup, "hedgerow-gateway"},
		{SubmitCancelSubjectFor("_INBOX.cl.alice.x", "r1"), "hedgerow.submit.cancel.alice.r1"},
		{SubmitCancelSubjectFor("_INBOX.gw.x", "r1"), "hedgerow.submit.cancel.r1"},
		{AttemptRecordSubject, "hedgerow.events.attempt"},
		{GroupRecordSubject, "hedgerow.events.group"},
		{LiveRecordPrefix + ">", "hedgerow.events.>"},
		{StoredGroupSubject("g"), "hedgerow.records.group.g"},
		{GatewayInboxPrefix, "_INBOX.gw"},
		{WorkerInboxPrefix, "_INBOX.wk"},
		{ObserverInboxPrefix, "_INBOX.ob"},
		{ClientInbox("alice"), "_INBOX.cl.alice"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if user, ok := ClientInboxUser(ClientInbox("alice") + ".x"); !ok || user != "alice" {
		t.Errorf("ClientInboxUser(ClientInbox(alice).x) = %q, %v", user, ok)
	}
}

// A deployment of one region keeps today's wire byte for byte, so a
// gateway of this release meets a worker of the last one.
func TestTheWireOfNoRegionIsTodaysWire(t *testing.T) {
	var w Wire
	for _, tc := range []struct{ got, want string }{
		{w.AttemptSubject("fake-a"), AttemptSubject("fake-a")},
		{w.AttemptSubjectPrefix(), AttemptSubjectPrefix},
		{w.WorkerQueueGroup("fake-a"), WorkerQueueGroup("fake-a")},
		{w.WorkerServiceName(), WorkerServiceName},
		{w.SubmitServiceName(), SubmitServiceName},
		{w.SubmitSubject(), SubmitSubject},
		{w.SubmitQueueGroup(), SubmitQueueGroup},
		{w.SubmitCancelPrefix(), SubmitCancelPrefix},
		{w.SubmitCancelUserPrefix("alice"), SubmitCancelUserPrefix("alice")},
		{w.SubmitCancelSubjectFor("_INBOX.cl.alice.x", "r1"), SubmitCancelSubjectFor("_INBOX.cl.alice.x", "r1")},
		{w.SubmitCancelSubjectFor("_INBOX.gw.x", "r1"), SubmitCancelSubjectFor("_INBOX.gw.x", "r1")},
		{w.LiveRecordPrefix(), LiveRecordPrefix},
		{w.AttemptRecordSubject(), AttemptRecordSubject},
		{w.GroupRecordSubject(), GroupRecordSubject},
		{w.StoredRecordPrefix(), StoredRecordPrefix},
		{w.StoredSubject(StoredAttemptSubject("g", 2)), StoredAttemptSubject("g", 2)},
		{w.JetStreamName("hedgerow_records"), "hedgerow_records"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// A region's names carry the region, pinned literally like today's
// (docs/architecture.md §8).
func TestARegionsWireCarriesTheRegion(t *testing.T) {
	w := RegionWire("east")
	for _, tc := range []struct{ got, want string }{
		{w.AttemptSubject("fake-a"), "hedgerow.east.attempt.fake-a"},
		{w.WorkerQueueGroup("fake-a"), "hedgerow-worker-fake-a_east"},
		{w.WorkerServiceName(), "hedgerow-worker_east"},
		{w.SubmitServiceName(), "hedgerow_east"},
		{w.SubmitSubject(), "hedgerow.east.submit"},
		{w.SubmitQueueGroup(), "hedgerow-gateway_east"},
		{w.SubmitCancelSubjectFor("_INBOX.cl.alice.x", "r1"), "hedgerow.east.submit.cancel.alice.r1"},
		{w.SubmitCancelSubjectFor("_INBOX.gw.x", "r1"), "hedgerow.east.submit.cancel.r1"},
		{w.AttemptRecordSubject(), "hedgerow.east.events.attempt"},
		{w.GroupRecordSubject(), "hedgerow.east.events.group"},
		{w.StoredRecordPrefix(), "hedgerow.east.records."},
		{w.StoredSubject(StoredGroupSubject("g")), "hedgerow.east.records.group.g"},
		{w.StoredSubject("other.subject"), "other.subject"},
		{w.JetStreamName("hedgerow_records"), "hedgerow_records_east"},
		{w.JetStreamName("hedgerow_gate"), "hedgerow_gate_east"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// Two regions share no subject, queue group or service name, and one
// region's cancels are not read as another's.
func TestTwoRegionsShareNoName(t *testing.T) {
	e, w := RegionWire("east"), RegionWire("west")
	names := func(x Wire) []string {
		return []string{x.AttemptSubject("r"), x.WorkerQueueGroup("r"), x.WorkerServiceName(), x.SubmitServiceName(),
			x.SubmitSubject(), x.SubmitQueueGroup(), x.SubmitCancelPrefix(), x.AttemptRecordSubject(),
			x.GroupRecordSubject(), x.StoredRecordPrefix(), x.JetStreamName("hedgerow_gate")}
	}
	seen := map[string]bool{}
	for _, n := range append(append(names(e), names(w)...), names(Wire{})...) {
		if seen[n] {
			t.Errorf("%q is named twice", n)
		}
		seen[n] = true
	}
	if _, _, err := e.ParseSubmitCancelSubject(w.SubmitCancelSubjectFor("_INBOX.gw.x", "0123456789abcdef0123456789abcdef")); err == nil {
		t.Error("east read west's cancel")
	}
	if _, id, err := e.ParseSubmitCancelSubject(e.SubmitCancelSubjectFor("_INBOX.cl.al.x", "r1")); err != nil || id != "r1" {
		t.Errorf("east's own cancel: id %q, err %v", id, err)
	}
}
