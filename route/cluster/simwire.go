package cluster

import (
	"fmt"

	"github.com/turnout/turnout/route/fleet"
)

// The wire format without NATS, for the sim of N fronts (lab/bench) to
// size, decode and time what each front sends and applies as a Sync would.

// AppendDecisionMessage appends a batch of one decision: what a publisher
// that found the queue holding only this decision sends.
func AppendDecisionMessage(b []byte, origin string, p *fleet.Pool, e *fleet.Endpoint, blocks []uint64) []byte {
	b = appendHeader(b, origin, p.Name, blockBytes(p))
	return appendRecord(b, e.Name, blocks)
}

// AppendLoadMessage appends origin's load message for p (loads.go): its
// in-flight count on every endpoint of the pool.
func AppendLoadMessage(b []byte, origin string, p *fleet.Pool) []byte {
	b, _ = appendLoads(b, origin, p)
	return b
}

// DecodeMessage validates a peer message whole, then hands each decision
// record to record (a batch) or each level to level (a load message). buf
// is scratch for the blocks, returned grown; record's blocks are valid
// until it returns.
func DecodeMessage(data []byte, buf []uint64, record func(endpoint []byte, blocks []uint64), level func(endpoint []byte, n int64)) ([]uint64, error) {
	if isLoads(data) {
		h, err := validateLoads(data)
		if err != nil {
			return buf, fmt.Errorf("cluster: load message: %w", err)
		}
		for rest := h.rest; len(rest) > 0; {
			var ep []byte
			var n int64
			if ep, n, rest, err = nextLevel(rest); err != nil {
				return buf, fmt.Errorf("cluster: load message: %w", err)
			}
			level(ep, n)
		}
		return buf, nil
	}
	h, _, err := validate(data)
	if err != nil {
		return buf, fmt.Errorf("cluster: batch: %w", err)
	}
	for rest := h.rest; len(rest) > 0; {
		var ep []byte
		if ep, buf, rest, err = nextRecord(rest, buf); err != nil {
			return buf, fmt.Errorf("cluster: batch: %w", err)
		}
		record(ep, buf)
	}
	return buf, nil
}
