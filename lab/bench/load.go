package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/contract"
)

// CostBody is one request of the cost load: a chat body and its session.
type CostBody struct {
	Body    []byte
	Session string
}

// CostBodies returns n realistic chat bodies, half of about 2 KiB and half
// of about 8 KiB: one of four shared system prompts (so prefix policies have
// something to match) and a user message of varied words, with one of 32
// sessions. maxTokens sets max_tokens (1 keeps the replicas' work minimal).
func CostBodies(n int, model string, maxTokens int, stream bool, seed uint64) []CostBody {
	return CostBodiesSized(n, model, maxTokens, stream, seed, 2048, 8192)
}

// CostBodiesSized is CostBodies with the body sizes given (cycled).
func CostBodiesSized(n int, model string, maxTokens int, stream bool, seed uint64, sizes ...int) []CostBody {
	rnd := rand.New(rand.NewPCG(seed, 0xc057))
	var w [wordLen]byte
	words := func(dst []byte, id uint64, bytes int) []byte {
		for j := 0; len(dst) < bytes; j++ {
			if j > 0 {
				dst = append(dst, ' ')
			}
			chunkWord(&w, id+uint64(j/BlockTokens), j%BlockTokens)
			dst = append(dst, w[:]...)
		}
		return dst
	}
	out := make([]CostBody, n)
	for i := range out {
		size := sizes[i%len(sizes)]
		sys := words(nil, 1<<50+uint64(rnd.IntN(4)), size/2)
		b := []byte(`{"model":` + strconv.Quote(model) + `,"messages":[{"role":"system","content":"`)
		b = append(b, sys...)
		b = append(b, `"},{"role":"user","content":"`...)
		tail := `"}],"max_tokens":` + strconv.Itoa(maxTokens)
		if stream {
			tail += `,"stream":true`
		}
		tail += "}"
		userLen := max(size-len(b)-len(tail), 16)
		b = append(b, words(nil, 1<<51+uint64(i)*7919+rnd.Uint64()%1000, userLen)[:userLen]...)
		b = append(b, tail...)
		out[i] = CostBody{Body: b, Session: "sess-" + strconv.Itoa(rnd.IntN(32))}
	}
	return out
}

// LoadTarget is what a load run hits.
type LoadTarget struct {
	Name string
	Addr string // host:port
	Path string
	// RouteHeaders adds the headers the proxy glue sends to /internal/route.
	RouteHeaders bool
}

// LoadResult is one load run.
type LoadResult struct {
	Requests, Errors int
	Elapsed          time.Duration
	// Latencies are all samples (Go load generator); wrk reports P50/P99 only.
	Latencies []time.Duration
	// Late are how late a paced generator sent each request after its
	// intended time (the client's own delay, in Latencies too).
	Late []time.Duration
	// Queued counts the paced sends that waited for a free connection
	// (every one busy: the server's backlog, not the client's delay).
	Queued int
	// SenderCPU is the paced sender thread's own CPU time (spin pacers).
	SenderCPU time.Duration
	P50, P99  time.Duration
	FirstErr  error
}

// RPS is successful requests per second.
func (r *LoadResult) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// GoLoad runs a closed loop of conns connections for d against t with
// fasthttp's client, recording every latency.
func GoLoad(ctx context.Context, t LoadTarget, bodies []CostBody, conns int, d time.Duration) (*LoadResult, error) {
	if len(bodies) == 0 || conns < 1 {
		return nil, errors.New("load: no bodies or connections")
	}
	hc := &fasthttp.HostClient{
		Addr: t.Addr, MaxConns: conns, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		MaxIdleConnDuration: time.Minute, NoDefaultUserAgentHeader: true,
	}
	defer hc.CloseIdleConnections()
	decides := make([]func(int) error, conns)
	for c := range conns {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		decides[c] = func(i int) error {
			b := &bodies[i%len(bodies)]
			req.Reset()
			req.SetRequestURI("http://" + t.Addr + t.Path)
			req.Header.SetMethod(fasthttp.MethodPost)
			req.Header.SetContentType("application/json")
			req.Header.Set("X-Session-Id", b.Session)
			if t.RouteHeaders {
				req.Header.Set(contract.HdrOriginalURI, mock.PathChat)
				req.Header.Set(contract.HdrOriginalMethod, fasthttp.MethodPost)
			}
			req.SetBodyRaw(b.Body)
			err := hc.Do(req, resp)
			if err == nil && resp.StatusCode() != fasthttp.StatusOK {
				err = fmt.Errorf("status %d: %.200s", resp.StatusCode(), resp.Body())
			}
			return err
		}
	}
	res, err := runWorkers(ctx, decides, d, nil)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", t.Name, err)
	}
	s := Summarize(Millis(res.Latencies))
	res.P50 = time.Duration(s.P50 * float64(time.Millisecond))
	res.P99 = time.Duration(s.P99 * float64(time.Millisecond))
	return res, nil
}

// WrkScript writes a wrk Lua script that cycles through bodies (formatted
// once per thread in init, so wrk spends its time sending).
func WrkScript(path string, t LoadTarget, bodies []CostBody) error {
	var b strings.Builder
	b.WriteString("-- Generated by turnout-lab bench cost.\nlocal bodies = {\n")
	for _, cb := range bodies {
		// Long brackets with a level no body contains (bodies are JSON of
		// letters and spaces).
		fmt.Fprintf(&b, "  { [==[%s]==], %q },\n", cb.Body, cb.Session)
	}
	b.WriteString("}\nlocal reqs = {}\nlocal i = 0\nfunction init(args)\n  for k, v in ipairs(bodies) do\n")
	b.WriteString("    local h = { [\"Content-Type\"] = \"application/json\", [\"X-Session-Id\"] = v[2]")
	if t.RouteHeaders {
		fmt.Fprintf(&b, ", [%q] = %q, [%q] = \"POST\"", contract.HdrOriginalURI, mock.PathChat, contract.HdrOriginalMethod)
	}
	fmt.Fprintf(&b, " }\n    reqs[k] = wrk.format(\"POST\", %q, h, v[1])\n  end\nend\n", t.Path)
	b.WriteString("function request()\n  i = i + 1\n  return reqs[(i % #reqs) + 1]\nend\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("wrk script: %w", err)
	}
	return nil
}

// WrkLoad runs wrk against t and parses its summary.
func WrkLoad(ctx context.Context, wrk, script string, t LoadTarget, threads, conns int, d time.Duration) (*LoadResult, error) {
	secs := max(int(d.Round(time.Second)/time.Second), 1)
	cmd := exec.CommandContext(ctx, wrk, "-t"+strconv.Itoa(threads), "-c"+strconv.Itoa(conns), "-d"+strconv.Itoa(secs)+"s",
		"--latency", "-s", script, "http://"+t.Addr+t.Path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("wrk %s: %w\n%s", t.Name, err, out)
	}
	res, err := ParseWrk(out)
	if err != nil {
		return nil, fmt.Errorf("wrk %s: %w\n%s", t.Name, err, out)
	}
	return res, nil
}

var (
	wrkTotalRe = regexp.MustCompile(`(\d+) requests in ([0-9.]+)(us|ms|s|m),`)
	wrkPctRe   = regexp.MustCompile(`^\s*(50|99)(?:\.0+)?%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkNon2xx  = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkSockErr = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

func wrkDuration(v, unit string) (time.Duration, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("wrk number %q: %w", v, err)
	}
	mult := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "m": time.Minute}[unit]
	return time.Duration(f * float64(mult)), nil
}

// ParseWrk reads requests, elapsed time, p50/p99 and errors from wrk --latency output.
func ParseWrk(out []byte) (*LoadResult, error) {
	res := &LoadResult{}
	var haveTotal, have50, have99 bool
	non2xx := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := wrkTotalRe.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			d, err := wrkDuration(m[2], m[3])
			if err != nil {
				return nil, err
			}
			res.Requests, res.Elapsed, haveTotal = n, d, true
		}
		if m := wrkPctRe.FindStringSubmatch(line); m != nil {
			d, err := wrkDuration(m[2], m[3])
			if err != nil {
				return nil, err
			}
			if m[1] == "50" {
				res.P50, have50 = d, true
			} else {
				res.P99, have99 = d, true
			}
		}
		if m := wrkNon2xx.FindStringSubmatch(line); m != nil {
			non2xx, _ = strconv.Atoi(m[1])
			res.Errors += non2xx
		}
		if m := wrkSockErr.FindStringSubmatch(line); m != nil {
			for _, s := range m[1:] {
				n, _ := strconv.Atoi(s)
				res.Errors += n
			}
		}
	}
	if !haveTotal || !have50 || !have99 {
		return nil, errors.New("no summary in wrk output")
	}
	// wrk counts non-2xx answers as requests; report successes only.
	res.Requests = max(res.Requests-non2xx, 0)
	return res, nil
}

// writeWrkScript is a helper for RunCost: one script per target.
func writeWrkScript(dir, group string, t LoadTarget, bodies []CostBody) (string, error) {
	p := filepath.Join(dir, "wrk-"+group+"-"+strings.NewReplacer("/", "_", " ", "_").Replace(t.Name)+".lua")
	return p, WrkScript(p, t, bodies)
}
