//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// chatEvents is what a chat completion event stream carried.
type chatEvents struct {
	content int             // events with a non-empty delta.content
	done    bool            // "data: [DONE]" arrived
	usage   json.RawMessage // the last non-null usage, if any
}

// readChatEvents reads an OpenAI chat completion event stream to its end.
func readChatEvents(r io.Reader) (chatEvents, error) {
	var out chatEvents
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			out.done = true
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return out, fmt.Errorf("bad event %q: %w", data, err)
		}
		if len(ev.Choices) > 0 && ev.Choices[0].Delta.Content != "" {
			out.content++
		}
		if len(ev.Usage) > 0 && string(ev.Usage) != "null" {
			out.usage = ev.Usage
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("reading the stream: %w", err)
	}
	return out, nil
}
