package bench

import (
	"errors"
	"fmt"
	"net"

	"github.com/turnout/turnout/route/contract"
)

// A transport client closes its decisions the way the proxies do: one
// feedback line (route/contract/feedback.go) over UDP syslog to turnout's
// feedback address when the request ends. Without it every decision stays
// open, the bounded-load guard spreads each hot prompt over the whole pool,
// and the bench would measure a state no fleet is in; turnout's CPU for
// reading the lines is part of what a decision costs it.

// closer sends one client's feedback lines. open is how many of its
// decisions stay open (requests still running) before the oldest is
// closed: 0 closes each at once.
type closer struct {
	c    net.Conn
	tok  string
	open int
	// lines is a ring of the open decisions' lines; next is the oldest.
	lines [][]byte
	next  int
}

// feedbackTo is where and how a client closes its decisions.
type feedbackTo struct {
	addr, token string // turnout's feedback address and the lines' token
	open        int    // TransportOptions.Open
}

// newCloser dials turnout's feedback address; without one, or with a
// negative open, it returns nil (decisions are never closed).
func newCloser(to feedbackTo) (*closer, error) {
	if to.open < 0 || to.addr == "" {
		return nil, nil
	}
	c, err := net.Dial("udp", to.addr)
	if err != nil {
		return nil, fmt.Errorf("feedback dial %s: %w", to.addr, err)
	}
	return &closer{c: c, tok: to.token, open: to.open, lines: make([][]byte, to.open+1)}, nil
}

// feedbackLine renders the line a proxy's log format writes for a 200
// from srv (the syslog header before the tag is skipped by turnout).
func feedbackLine(dst []byte, id, srv []byte, tok string) []byte {
	dst = append(dst[:0], "<134>"+contract.FeedbackTag+" "+contract.FeedbackFieldID+"="...)
	dst = append(dst, id...)
	dst = append(dst, " "+contract.FeedbackFieldServer+"="...)
	dst = append(dst, srv...)
	dst = append(dst, " "+contract.FeedbackFieldStatus+"=200 "+contract.FeedbackFieldMs+"=20 "+contract.FeedbackFieldTTFB+"=5"...)
	if tok != "" {
		dst = append(append(dst, " "+contract.FeedbackFieldToken+"="...), tok...)
	}
	return append(dst, " "+contract.FeedbackFieldTerm+"=--"...)
}

// done records a decision's end; the line goes out once open later ones
// followed it. A nil closer does nothing.
func (c *closer) done(id, srv []byte) error {
	if c == nil {
		return nil
	}
	if len(id) == 0 || len(srv) == 0 {
		return errors.New("feedback: an answer without a decision id or server")
	}
	slot := &c.lines[(c.next+c.open)%len(c.lines)]
	*slot = feedbackLine(*slot, id, srv, c.tok)
	oldest := c.lines[c.next]
	c.next = (c.next + 1) % len(c.lines)
	if len(oldest) == 0 { // fewer than open decisions so far
		return nil
	}
	if _, err := c.c.Write(oldest); err != nil {
		return fmt.Errorf("feedback: %w", err)
	}
	return nil
}

// Close sends the lines of the decisions still open and closes the socket.
func (c *closer) Close() error {
	if c == nil {
		return nil
	}
	var errs []error
	for range c.open {
		if l := c.lines[c.next]; len(l) > 0 {
			if _, err := c.c.Write(l); err != nil {
				errs = append(errs, err)
			}
		}
		c.next = (c.next + 1) % len(c.lines)
	}
	return errors.Join(append(errs, c.c.Close())...)
}
