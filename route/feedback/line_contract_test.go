package feedback

import (
	"reflect"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// The reader and the feedback line's table (route/contract/feedback.go) agree:
// each field the table marks Read changes what the reader finds, each
// other field is ignored, and every key the reader knows is a Read row.
func TestFeedbackReaderFollowsTable(t *testing.T) {
	empty, _ := parseFeedbackLine([]byte(contract.FeedbackTag + " "))
	read := map[string]bool{}
	for _, f := range contract.FeedbackLineFields() {
		got, ok := parseFeedbackLine([]byte(contract.FeedbackTag + " " + f.Key + "=42"))
		if !ok {
			t.Fatalf("%s: no line", f.Key)
		}
		if acts := !reflect.DeepEqual(got, empty); acts != f.Read {
			t.Errorf("field %s: the reader acts on it: %v; the table says Read: %v", f.Key, acts, f.Read)
		}
		read[f.Key] = f.Read
	}
	for _, k := range []string{contract.FeedbackFieldID, contract.FeedbackFieldServer, contract.FeedbackFieldStatus, contract.FeedbackFieldMs, contract.FeedbackFieldTTFB, contract.FeedbackFieldToken} {
		if !read[k] {
			t.Errorf("the reader's key %s is not a Read row of contract.FeedbackLineFields", k)
		}
	}
}
