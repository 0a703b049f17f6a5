package feedback

import (
	"reflect"
	"testing"

	"github.com/turnout/turnout/route"
)

// The reader and the feedback line's table (route/contract_feedback.go) agree:
// each field the table marks Read changes what the reader finds, each
// other field is ignored, and every key the reader knows is a Read row.
func TestFeedbackReaderFollowsTable(t *testing.T) {
	empty, _ := parseFeedbackLine([]byte(route.FeedbackTag + " "))
	read := map[string]bool{}
	for _, f := range route.FeedbackLineFields() {
		got, ok := parseFeedbackLine([]byte(route.FeedbackTag + " " + f.Key + "=42"))
		if !ok {
			t.Fatalf("%s: no line", f.Key)
		}
		if acts := !reflect.DeepEqual(got, empty); acts != f.Read {
			t.Errorf("field %s: the reader acts on it: %v; the table says Read: %v", f.Key, acts, f.Read)
		}
		read[f.Key] = f.Read
	}
	for _, k := range []string{route.FeedbackFieldID, route.FeedbackFieldServer, route.FeedbackFieldStatus, route.FeedbackFieldMs, route.FeedbackFieldTTFB, route.FeedbackFieldToken} {
		if !read[k] {
			t.Errorf("the reader's key %s is not a Read row of route.FeedbackLineFields", k)
		}
	}
}
