package schemas

import (
	"errors"
	"strings"
	"testing"
)

func TestClientInboxUserIsReadOnlyFromAClientUsersInbox(t *testing.T) {
	for _, tc := range []struct {
		subject string
		user    string
		ok      bool
	}{
		{"_INBOX.cl.alice.abc.1", "alice", true},
		{"_INBOX.cl.bob-2.x", "bob-2", true},
		{"_INBOX.cl.alice", "", false},  // the prefix itself, no inbox under it
		{"_INBOX.cl.alice.", "", false}, // an empty inbox token
		{"_INBOX.cl.Alice.x", "", false},
		{"_INBOX.cl..x", "", false},
		{"_INBOX.gw.alice.x", "", false},
		{"_INBOX.abc.1", "", false},
		{"_INBOX.clx.alice.1", "", false},
		{"", "", false},
	} {
		user, ok := ClientInboxUser(tc.subject)
		if user != tc.user || ok != tc.ok {
			t.Errorf("ClientInboxUser(%q) = %q, %v; want %q, %v", tc.subject, user, ok, tc.user, tc.ok)
		}
	}
}

func TestTheCancelSubjectOfACallerIsTheOneTheGatewayReadsBack(t *testing.T) {
	id := strings.Repeat("a1", 16)
	for _, tc := range []struct {
		name, inbox, subject, user string
	}{
		{"a client user's inbox", "_INBOX.cl.alice.nuid", "hedgerow.submit.cancel.alice." + id, "alice"},
		{"another inbox", "_INBOX.nuid", "hedgerow.submit.cancel." + id, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			subject := SubmitCancelSubjectFor(tc.inbox, id)
			if subject != tc.subject {
				t.Fatalf("cancel subject %q, want %q", subject, tc.subject)
			}
			user, gotID, err := ParseSubmitCancelSubject(subject)
			if err != nil || user != tc.user || gotID != id {
				t.Fatalf("parsed %q, %q, %v; want %q, %q", user, gotID, err, tc.user, id)
			}
		})
	}
}

func TestASubjectOfAnotherFormIsNoCancel(t *testing.T) {
	for _, subject := range []string{
		"hedgerow.submit.cancel.",
		"hedgerow.submit.cancel.alice.",
		"hedgerow.submit.cancel.alice.a.b",
		"hedgerow.submit.cancel.Alice.id",
		"hedgerow.submit.cancel.id!",
		"hedgerow.submit.cancel." + strings.Repeat("x", 65),
		"hedgerow.submit.other",
	} {
		if _, _, err := ParseSubmitCancelSubject(subject); !errors.Is(err, ErrMalformedCancel) {
			t.Errorf("ParseSubmitCancelSubject(%q) = %v, want ErrMalformedCancel", subject, err)
		}
	}
}

func TestOnlyARequestIDOf128BitsAsHexIsUnguessable(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{strings.Repeat("f", 32), true},
		{strings.Repeat("f", 64), true},
		{strings.Repeat("f", 31), false},
		{"job-43", false},
		{strings.Repeat("f", 31) + ".", false},
		{strings.Repeat("f", 65), false},
	} {
		if got := UnguessableSubmitRequestID(tc.id); got != tc.want {
			t.Errorf("UnguessableSubmitRequestID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}
