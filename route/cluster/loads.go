package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/turnout/turnout/route/fleet"
)

// Load messages: with its decisions, each instance publishes
// its in-flight count per endpoint of the pool, a level rather than a
// delta, so a lost message is corrected by the next and a peer that goes
// silent stops mattering at the next engine scrape (Endpoint.Load counts
// the change since the scrape). Fronts then balance on one load view
// instead of herding onto the replica each alone sees least loaded.
//
//	magic "TPL1", then the batch header's fields (origin, pool, block bytes)
//	records until the end: u8 len, endpoint name; uvarint in-flight count
//
// A separate magic rather than a new record kind: an instance that does
// not know it refuses the whole message (counted malformed) and still
// applies the decision batches.
const loadMagic = "TPL1"

// maxLevel bounds a reported in-flight count.
const maxLevel = 1 << 31

var errLevel = errors.New("in-flight count out of range")

// appendLoads writes p's load message: this instance's in-flight count on
// each of its endpoints; open reports whether any of them is above 0.
func appendLoads(b []byte, origin string, p *fleet.Pool) (_ []byte, open bool) {
	b = appendHeader(b, origin, p.Name, blockBytes(p))
	copy(b, loadMagic)
	for _, e := range p.Endpoints {
		n := max(0, e.Inflight())
		open = open || n > 0
		b = append(b, byte(len(e.Name)))
		b = append(b, e.Name...)
		b = binary.AppendUvarint(b, uint64(n))
	}
	return b, open
}

// isLoads tells a load message from a decision batch.
func isLoads(b []byte) bool {
	return len(b) >= len(loadMagic) && string(b[:len(loadMagic)]) == loadMagic
}

// nextLevel decodes the next record of a load message.
func nextLevel(rest []byte) (endpoint []byte, level int64, tail []byte, err error) {
	endpoint, rest, err = readName(rest)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("endpoint: %w", err)
	}
	n, k := binary.Uvarint(rest)
	if k <= 0 {
		return nil, 0, nil, errTruncated
	}
	if n >= maxLevel {
		return nil, 0, nil, errLevel
	}
	return endpoint, int64(n), rest[k:], nil
}

// validateLoads checks a whole load message before any level is applied.
func validateLoads(b []byte) (header, error) {
	if !isLoads(b) {
		return header{}, errMagic
	}
	h, err := decodeHeaderFields(b[len(loadMagic):])
	if err != nil {
		return h, err
	}
	for rest := h.rest; len(rest) > 0; {
		if _, _, rest, err = nextLevel(rest); err != nil {
			return h, err
		}
	}
	return h, nil
}

// peerLevels is one subscription's record of each peer's last reported
// in-flight counts (origin -> endpoint -> count), so a new level moves the
// endpoint's peer load by the difference. Used by the subscription's own
// goroutine only.
type peerLevels map[string]map[string]int64

// apply moves p's endpoints' peer loads to origin's reported levels.
func (pl peerLevels) apply(origin []byte, p *fleet.Pool, rest []byte) (applied, unknown int) {
	levels := pl[string(origin)]
	if levels == nil {
		levels = map[string]int64{}
		pl[string(origin)] = levels
	}
	for len(rest) > 0 {
		ep, level, tail, err := nextLevel(rest)
		if err != nil { // validated before; defensive
			return applied, unknown
		}
		rest = tail
		e := p.EndpointByName(ep)
		if e == nil {
			unknown++
			continue
		}
		old, ok := levels[string(ep)]
		if !ok || old != level {
			levels[string(ep)] = level
			e.AddPeerLoad(level - old)
		}
		applied++
	}
	return applied, unknown
}
