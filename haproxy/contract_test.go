package haproxy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
)

// luaSection returns the contract's data section of a rendered Lua.
func luaSection(t *testing.T, lua string) string {
	t.Helper()
	_, rest, ok := strings.Cut(lua, "-- The glue contract (route/contract_glue.go)")
	sec, _, ok2 := strings.Cut(rest, "-- Breaker")
	if !ok || !ok2 {
		t.Fatal("the Lua has no contract section")
	}
	return "-- The glue contract (route/contract_glue.go)" + sec
}

// unLua reads back a Lua string literal as luaQuote or luaJSON wrote it.
func unLua(t *testing.T, s string) string {
	t.Helper()
	if strings.HasPrefix(s, "'") {
		return strings.Trim(s, "'")
	}
	out, err := strconv.Unquote(regexp.MustCompile(`\\(\d{3})`).ReplaceAllStringFunc(s, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		return string(rune(n))
	}))
	if err != nil {
		t.Fatalf("Lua string %s: %v", s, err)
	}
	return out
}

// The rendered Lua carries the contract table of route/contract_glue.go:
// parsed back out of the Lua, every table equals the Go one. The section is
// also kept as a golden file, so a contract change shows in review.
func TestLuaCarriesContract(t *testing.T) {
	out, err := Render(mustParse(t, []byte(multiYAML)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	sec := luaSection(t, string(out.Lua))
	str := `("[^"]*"|'[^']*')`
	one := func(re string) []string {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(sec)
		if m == nil {
			t.Fatalf("the Lua lacks %s", re)
		}
		return m[1:]
	}

	// Verdict fields: the string fields with a header and an HAProxy variable.
	var want, got [][2]string
	for _, f := range contract.VerdictFields() {
		if f.Header != "" && f.HAProxyVar != "" && f.Kind == contract.KindString && f.Name != "reason" {
			want = append(want, [2]string{strings.ToLower(f.Header), f.HAProxyVar})
		}
	}
	block := one(`(?s)local VERDICT_VARS = \{(.*?)\n\}`)[0]
	for _, m := range regexp.MustCompile(`\{ `+str+`, `+str+` \}`).FindAllStringSubmatch(block, -1) {
		got = append(got, [2]string{unLua(t, m[1]), unLua(t, m[2])})
	}
	if !slices.Equal(got, want) {
		t.Errorf("VERDICT_VARS %v, want %v", got, want)
	}
	field := func(name string) contract.VerdictField { return contract.VerdictFieldNamed(name) }
	if h := unLua(t, one(`local REQUIRED_HEADER = ` + str)[0]); h != strings.ToLower(field("server").Header) {
		t.Errorf("REQUIRED_HEADER %q", h)
	}
	if h := unLua(t, one(`local FALLBACKS_HEADER = ` + str)[0]); h != strings.ToLower(field("fallbacks").Header) {
		t.Errorf("FALLBACKS_HEADER %q", h)
	}
	if h := unLua(t, one(`local REASON_HEADER = ` + str)[0]); h != strings.ToLower(field("reason").Header) {
		t.Errorf("REASON_HEADER %q", h)
	}
	if v := unLua(t, one(`local REASON_VAR = ` + str)[0]); v != field("reason").HAProxyVar {
		t.Errorf("REASON_VAR %q", v)
	}
	e := one(`local EDIT = \{ insert = ` + str + `, at = ` + str + `, var = ` + str + `, at_var = ` + str + ` \}`)
	if gotE, wantE := []string{unLua(t, e[0]), unLua(t, e[1]), unLua(t, e[2]), unLua(t, e[3])},
		[]string{strings.ToLower(field("kv_insert").Header), strings.ToLower(field("kv_at").Header), field("kv_insert").HAProxyVar, field("kv_at").HAProxyVar}; !slices.Equal(gotE, wantE) {
		t.Errorf("EDIT %v, want %v", gotE, wantE)
	}

	// Reason actions and relay statuses.
	var gotR, wantR []string
	for _, r := range contract.ReasonRules() {
		wantR = append(wantR, r.Reason+"="+string(r.Action))
	}
	block = one(`(?s)local REASON_ACTIONS = \{(.*?)\n\}`)[0]
	for _, m := range regexp.MustCompile(`\[`+str+`\] = `+str).FindAllStringSubmatch(block, -1) {
		gotR = append(gotR, unLua(t, m[1])+"="+unLua(t, m[2]))
	}
	if !slices.Equal(gotR, wantR) {
		t.Errorf("REASON_ACTIONS %v, want %v", gotR, wantR)
	}
	var gotS []int
	for _, m := range regexp.MustCompile(`\[(\d+)\] = true`).FindAllStringSubmatch(one(`local RELAY_STATUSES = \{(.*)\}`)[0], -1) {
		n, _ := strconv.Atoi(m[1])
		gotS = append(gotS, n)
	}
	if !slices.Equal(gotS, contract.RelayStatuses()) {
		t.Errorf("RELAY_STATUSES %v, want %v", gotS, contract.RelayStatuses())
	}

	// The glue's own error bodies.
	fc := one(`local FAIL_CLOSED = \{ status = (\d+), body = \{ ` + str + `, ` + str + ` \} \}`)
	if got, want := fc[0]+" "+unLua(t, fc[1])+"R"+unLua(t, fc[2]),
		strconv.Itoa(contract.FailClosedError.Status)+" "+strings.Replace(contract.FailClosedError.JSON(), contract.ReasonToken, "R", 1); got != want {
		t.Errorf("FAIL_CLOSED %s, want %s", got, want)
	}
	tl := one(`local DECODE_TOO_LARGE = \{ status = (\d+), reason = ` + str + `, body = ` + str + ` \}`)
	if got, want := tl[0]+" "+unLua(t, tl[1])+" "+unLua(t, tl[2]),
		strconv.Itoa(contract.DecodeTooLargeError.Status)+" "+contract.DecodeTooLargeError.Code+" "+contract.DecodeTooLargeError.JSON(); got != want {
		t.Errorf("DECODE_TOO_LARGE %s, want %s", got, want)
	}
	if got := unLua(t, one(`local BAD_ANSWER = ` + str)[0]); got != contract.BadAnswerReason {
		t.Errorf("BAD_ANSWER %q", got)
	}
	checkGolden(t, filepath.Join("testdata", "contract.lua.golden"), sec)
}

// The rendered SPOE config carries the same contract: it relays exactly the
// statuses of the table (when the agent set a body), copies every variable
// the table pairs, registers every agent variable, and answers the glue's
// own errors with the table's bodies.
func TestSPOECarriesContract(t *testing.T) {
	cfg := mustParse(t, []byte(multiYAML)) // qwen is prefill/decode
	cfg.HAProxy.Path = config.HAProxyPathSPOE
	cfg.HAProxy.SPOE = "127.0.0.1:9091"
	out, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	conf, spoe := string(out.Config), string(out.SPOE)

	var gotS []int
	for _, m := range regexp.MustCompile(`http-request return status (\d+) content-type application/json lf-string "%\[var\(txn\.turnout\.body\)\]" hdr x-turnout-reason "%\[var\(txn\.turnout\.reason\)\]" if \{ var\(txn\.turnout\.status\) -m int (\d+) \}\n`).FindAllStringSubmatch(conf, -1) {
		if m[1] != m[2] {
			t.Errorf("relays status %s as %s", m[2], m[1])
		}
		n, _ := strconv.Atoi(m[1])
		gotS = append(gotS, n)
	}
	wantS := contract.RelayStatuses()
	for _, r := range contract.ReasonRules() {
		if r.Action == contract.GlueRelay && !slices.Contains(wantS, r.Status) {
			wantS = append(wantS, r.Status)
		}
	}
	if !slices.Equal(gotS, wantS) {
		t.Errorf("relayed statuses %v, want %v", gotS, wantS)
	}

	// haproxy.cfg reads the agent's own variables: no rule copies one
	// (each would run on every request).
	if m := regexp.MustCompile(`http-request set-var\(\S+\) var\(txn\.turnout\.\S+\)`).FindAllString(conf, -1); len(m) > 0 {
		t.Errorf("variable copies rendered: %q", m)
	}
	if !strings.Contains(spoe, "\n    option var-prefix "+contract.SPOEVarPrefix+"\n") {
		t.Errorf("the agent's var-prefix is not %s", contract.SPOEVarPrefix)
	}
	for _, f := range contract.VerdictFields() {
		if f.SPOEVar != "" && f.HAProxyVar != "" && f.HAProxyVar != "txn."+contract.SPOEVarPrefix+"."+f.SPOEVar {
			t.Errorf("field %s: haproxy.cfg reads %s, the agent sets txn.%s.%s", f.Name, f.HAProxyVar, contract.SPOEVarPrefix, f.SPOEVar)
		}
	}

	reg := regexp.MustCompile(`register-var-names (.*)`).FindStringSubmatch(spoe)
	if reg == nil {
		t.Fatal("no register-var-names")
	}
	names := strings.Fields(reg[1])
	for _, f := range contract.VerdictFields() {
		if f.SPOEVar == "" {
			continue
		}
		n := f.SPOEVar
		if f.Kind == contract.KindList {
			n += "1"
		}
		if !slices.Contains(names, n) {
			t.Errorf("SPOE variable %s (field %s) not registered: %v", n, f.Name, names)
		}
	}

	// Prefill/decode: the first agent registers the mark that sends a
	// request to the second, which carries the agent's second message.
	if !slices.Contains(names, contract.SPOEVarPD) {
		t.Errorf("the first agent does not register %s: %v", contract.SPOEVarPD, names)
	}
	if !strings.Contains(spoe, "\nspoe-message "+contract.SPOEMessageRoutePD+"\n") || !strings.Contains(conf, "send-spoe-group turnout-pd "+contract.SPOEMessageRoutePD+" if { var(txn.turnout."+contract.SPOEVarPD+") -m found }") {
		t.Errorf("no second call for prefill/decode (%s)", contract.SPOEMessageRoutePD)
	}
	if !strings.Contains(spoe, " "+contract.SPOEArgDeferPD+"=bool(true)\n") {
		t.Errorf("the first message does not ask to defer prefill/decode decisions (%s)", contract.SPOEArgDeferPD)
	}
	// A message read past timeout processing is not decided (route/spoe/late.go).
	if !strings.Contains(spoe, " "+contract.SPOEArgSent+"=date(0,ms)") {
		t.Errorf("the first message does not carry HAProxy's clock (%s)", contract.SPOEArgSent)
	}

	fc := contract.FailClosedError
	pre, post, _ := strings.Cut(fc.JSON(), contract.ReasonToken)
	if cfg.Proxy.FailMode == config.FailClosed {
		if want := "lf-string '" + pre + "%[var(txn.turnout.reason)]" + post + "'"; !strings.Contains(conf, want) {
			t.Errorf("fail-closed answer lacks %s", want)
		}
	}
	tl := contract.DecodeTooLargeError
	if want := "return status " + strconv.Itoa(tl.Status) + " content-type application/json string '" + tl.JSON() + "' hdr x-turnout-reason " + tl.Code; !strings.Contains(conf, want) {
		t.Errorf("config lacks the decode-too-large answer %s", want)
	}
	_, front, _ := strings.Cut(conf, "filter spoe engine turnout")
	front, _, _ = strings.Cut(front, "\nbackend ")
	front = "    filter spoe engine turnout" + front
	checkGolden(t, filepath.Join("testdata", "contract.spoe-frontend.golden"), front)
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./haproxy -run Contract -update)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs (run with -update after checking the diff):\n%s", path, got)
	}
}
