// Package bench measures turnout: routing quality by replaying public LLM
// traces (in-process discrete-event simulation or end to end through HAProxy
// and mock replicas) and the cost of a decision (throughput and latency side
// by side with a trivial handler and with plain HAProxy).
//
// Results go to an output directory as a text table, a CSV file and an SVG
// chart; BENCHMARKS.md at the repository root records the figures.
package bench

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// BlockTokens is the number of prompt tokens one Mooncake hash id stands for.
const BlockTokens = 512

// Request is one trace line, ready to be expanded into a prompt.
type Request struct {
	Index   int
	Arrival time.Duration // since the first request, before compression
	// InputTokens is the prompt length in words; the chat template adds one
	// role token in front, which the replica's cache also counts.
	InputTokens  int
	OutputTokens int
	// HashIDs name the prompt's 512-token chunks; equal leading ids mean an
	// equal prompt prefix.
	HashIDs []uint64
	// Session is a client session key ("" = none sent).
	Session string
	// Class and Tenant are sent as the flow control headers ("" = none;
	// bench flow sets them).
	Class, Tenant string
	// Model is the request's LoRA adapter ("" = the base model; WithAdapters).
	Model string
}

// ModelOr is the model r names: its adapter, else base.
func (r *Request) ModelOr(base string) string {
	if r.Model != "" {
		return r.Model
	}
	return base
}

// ErrEmptyTrace is returned when a trace yields no request.
var ErrEmptyTrace = errors.New("trace has no requests")

// TraceOptions shape how a trace file becomes requests.
type TraceOptions struct {
	// Limit keeps only the first Limit requests (0 = all).
	Limit int
	// SessionBlocks > 0 gives each Mooncake request the session key of its
	// first SessionBlocks hash ids: requests sharing a root document or
	// conversation share a session, the best a session-id client could do.
	SessionBlocks int
}

// LoadTrace reads a Mooncake JSONL (.jsonl) or Azure CSV (.csv) trace.
func LoadTrace(path string, o TraceOptions) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	var reqs []Request
	if strings.HasSuffix(path, ".csv") {
		reqs, err = ReadAzure(f, o)
	} else {
		reqs, err = ReadMooncake(f, o)
	}
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

type mooncakeLine struct {
	Timestamp    float64  `json:"timestamp"` // ms since trace start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// ReadMooncake parses the Mooncake trace format (one JSON object per line).
func ReadMooncake(r io.Reader, o TraceOptions) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var out []Request
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var m mooncakeLine
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if m.InputLength < 1 || len(m.HashIDs) == 0 {
			return nil, fmt.Errorf("line %d: input_length %d with %d hash ids", line, m.InputLength, len(m.HashIDs))
		}
		// The format promises len(hash_ids) == ceil(input/512); a longer
		// input than the ids cover would need chunks nobody named.
		if m.InputLength > len(m.HashIDs)*BlockTokens {
			return nil, fmt.Errorf("line %d: input_length %d exceeds %d hash ids x %d", line, m.InputLength, len(m.HashIDs), BlockTokens)
		}
		req := Request{
			Index:        len(out),
			Arrival:      time.Duration(m.Timestamp * float64(time.Millisecond)),
			InputTokens:  m.InputLength,
			OutputTokens: max(m.OutputLength, 1),
			HashIDs:      m.HashIDs,
		}
		if o.SessionBlocks > 0 {
			var sb strings.Builder
			sb.WriteString("s")
			for i, id := range m.HashIDs[:min(o.SessionBlocks, len(m.HashIDs))] {
				if i > 0 {
					sb.WriteByte('-')
				}
				sb.WriteString(strconv.FormatUint(id, 10))
			}
			req.Session = sb.String()
		}
		out = append(out, req)
		if o.Limit > 0 && len(out) >= o.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if len(out) == 0 {
		return nil, ErrEmptyTrace
	}
	return out, nil
}

// azureIDBase keeps Azure's synthetic chunk ids clear of any Mooncake id:
// the Azure trace has no prefix information, so every request gets chunks
// of its own and nothing is shared.
const azureIDBase = 1 << 40

// azureTimeLayout is the trace's timestamp format (100 ns resolution).
const azureTimeLayout = "2006-01-02 15:04:05.9999999"

// ReadAzure parses the Azure LLM inference trace CSV
// (TIMESTAMP,ContextTokens,GeneratedTokens). Prompts share nothing.
func ReadAzure(r io.Reader, o TraceOptions) ([]Request, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	var (
		out   []Request
		first time.Time
	)
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if line == 1 && strings.EqualFold(strings.TrimSpace(rec[0]), "TIMESTAMP") {
			continue
		}
		ts, err := time.Parse(azureTimeLayout, strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, fmt.Errorf("line %d: timestamp: %w", line, err)
		}
		in, err1 := strconv.Atoi(strings.TrimSpace(rec[1]))
		outTok, err2 := strconv.Atoi(strings.TrimSpace(rec[2]))
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(out) == 0 {
			first = ts
		}
		in = max(in, 1)
		n := (in + BlockTokens - 1) / BlockTokens
		ids := make([]uint64, n)
		for i := range ids {
			ids[i] = azureIDBase + uint64(len(out))<<20 + uint64(i)
		}
		out = append(out, Request{
			Index:        len(out),
			Arrival:      ts.Sub(first),
			InputTokens:  in,
			OutputTokens: max(outTok, 1),
			HashIDs:      ids,
		})
		if o.Limit > 0 && len(out) >= o.Limit {
			break
		}
	}
	if len(out) == 0 {
		return nil, ErrEmptyTrace
	}
	return out, nil
}
