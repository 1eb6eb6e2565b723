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
