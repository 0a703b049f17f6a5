package haproxy

import (
	"strings"

	"github.com/turnout/turnout/route/contract"
)

// luaContract is the glue contract of route/contract/glue.go as Lua
// literals, rendered into the data section of lua/turnout.lua.tmpl. Header
// names are lowercase: that is how core.httpclient hands them over.
type luaContract struct {
	OrigURI, OrigMethod, Truncated string
	Vars                           []luaVar
	Required, Fallbacks, Reason    string
	RetryAfter                     string
	DeferPD, PD                    string
	ReasonVar                      string
	EditInsert, EditAt             string
	EditVar, EditAtVar             string
	ReasonActions                  []luaReasonAction
	RelayStatuses                  []int
	BadAnswer                      string
	FailClosed                     struct {
		Status    int
		Pre, Post string
	}
	TooLarge struct {
		Status       int
		Reason, Body string
	}
}

type luaVar struct{ Header, Var string }

type luaReasonAction struct{ Reason, Action string }

func lowerQuote(s string) string { return luaQuote(strings.ToLower(s)) }

// luaJSON quotes JSON text for Lua: in single quotes when it needs no
// escape there (readable), else as luaQuote does.
func luaJSON(s string) string {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '\'' || c == '\\' {
			return luaQuote(s)
		}
	}
	return "'" + s + "'"
}

func newLuaContract() luaContract {
	c := luaContract{
		OrigURI:       lowerQuote(contract.HdrOriginalURI),
		OrigMethod:    lowerQuote(contract.HdrOriginalMethod),
		Truncated:     lowerQuote(contract.HdrBodyTruncated),
		RelayStatuses: contract.RelayStatuses(),
		BadAnswer:     luaQuote(contract.BadAnswerReason),
	}
	g := contract.GlueVerdict()
	c.Required, c.Fallbacks = lowerQuote(g.Required.Header), lowerQuote(g.Fallbacks.Header)
	c.Reason, c.ReasonVar = lowerQuote(g.Reason.Header), luaQuote(g.Reason.HAProxyVar)
	c.RetryAfter = lowerQuote(g.RetryAfter.Header)
	c.DeferPD, c.PD = lowerQuote(contract.HdrDeferPD), lowerQuote(contract.HdrPD)
	c.EditInsert, c.EditVar = lowerQuote(g.EditInsert.Header), luaQuote(g.EditInsert.HAProxyVar)
	c.EditAt, c.EditAtVar = lowerQuote(g.EditAt.Header), luaQuote(g.EditAt.HAProxyVar)
	for _, f := range g.Copied {
		if f.HAProxyVar != "" {
			c.Vars = append(c.Vars, luaVar{lowerQuote(f.Header), luaQuote(f.HAProxyVar)})
		}
	}
	for _, r := range contract.ReasonRules() {
		c.ReasonActions = append(c.ReasonActions, luaReasonAction{luaQuote(r.Reason), luaQuote(string(r.Action))})
	}
	fc := contract.FailClosedError
	pre, post, _ := strings.Cut(fc.JSON(), contract.ReasonToken)
	c.FailClosed.Status, c.FailClosed.Pre, c.FailClosed.Post = fc.Status, luaJSON(pre), luaJSON(post)
	tl := contract.DecodeTooLargeError
	c.TooLarge.Status, c.TooLarge.Reason, c.TooLarge.Body = tl.Status, luaQuote(tl.Code), luaJSON(tl.JSON())
	return c
}
