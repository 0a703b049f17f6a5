// turnout njs glue for nginx body mode. Written next to nginx.conf by
// `turnout render nginx` (as turnout.js); edits are overwritten on the next sync.
//
// route() is the content handler of body-mode requests; tft() the body
// filter that times the first response body bytes (both modes). nginx has read the
// whole body into memory (client_body_buffer_size = client_max_body_size),
// so it travels with the routing headers to turnout in a subrequest; the
// verdict goes into js_var variables, which survive the internal redirect to
// the location that proxies the request. No policy lives here: the code only
// carries turnout's inputs and verdict, relays its refusals, applies the fail
// mode and, for prefill/decode, builds the decode body.
//
// Inputs from nginx.conf: $turnout_fail_mode (open|closed) and the map
// $turnout_body_pool keyed by $turnout_body_model.
//
// A template: nginx/ renders the contract's data section below from
// route/contract_glue.go; the code only follows it.

// The glue contract, rendered as data -------------------------------------
// Verdict fields copied as they are: [answer header, js_var].
var VERDICT_VARS = {{.VerdictVars}};
// An answer without this header is a bad answer (fail mode).
var REQUIRED_HEADER = {{.Required}};
var REASON_HEADER = {{.Reason}};
var RETRY_AFTER_HEADER = {{.RetryAfter}};
// Prefill/decode body edit: insert the (base64) text at the byte offset.
var EDIT = {{.Edit}};
// What to do with a turnout answer that names no replica: the reason's
// action if listed, else relay a 4xx and apply the fail mode otherwise.
var REASON_ACTIONS = {{.ReasonActions}};
// 4xx statuses relayed as they are; any other relayed 4xx goes out as 400.
var RELAY_STATUSES = {{.RelayStatuses}};
var BAD_ANSWER = {{.BadAnswer}};
// The glue's own answer under fail_mode closed; the reason is its code.
var FAIL_CLOSED = {{.FailClosed}};
// -------------------------------------------------------------------------

var ASK = '/_turnout/ask_body';
var PROXY = '@turnout_proxy';
var PROXY_PD = '@turnout_proxy_pd';
var OPEN = '@turnout_open';

// Reasons end up in a response header: keep them to a plain token.
function token(s) {
    return String(s).replace(/[^A-Za-z0-9_.-]/g, '').slice(0, 64) || 'unknown';
}

// action is what the glue does with turnout's answer st that names no
// replica (route.GlueActionFor).
function action(st, reason) {
    return REASON_ACTIONS[reason] || (st >= 400 && st < 500 ? 'relay' : 'fail');
}

function errorJSON(message, type, code) {
    return JSON.stringify({error: {message: message, type: type, code: code}});
}

// answer ends the request with an OpenAI-style error of turnout's glue.
function answer(r, status, type, reason, message) {
    reason = token(reason);
    r.headersOut['Content-Type'] = 'application/json';
    r.headersOut[REASON_HEADER] = reason;
    r.return(status, errorJSON(message, type, reason));
}

// relay hands turnout's own refusal to the client: status, reason, JSON body.
function relay(r, res, reason) {
    var h = res.headersOut;
    var st = res.status;
    if (st < 500 && RELAY_STATUSES.indexOf(st) < 0) {
        st = 400;
    }
    r.headersOut['Content-Type'] = h['Content-Type'] || 'application/json';
    r.headersOut[REASON_HEADER] = token(reason);
    if (h[RETRY_AFTER_HEADER]) {
        r.headersOut[RETRY_AFTER_HEADER] = h[RETRY_AFTER_HEADER];
    }
    r.return(st, res.responseText || '');
}

// modelOf finds the request's model for the fail-open pool. It parses the
// body, so it runs only when turnout gave no verdict.
function modelOf(r, body) {
    try {
        var o = JSON.parse(body);
        if (o && typeof o.model === 'string') {
            return o.model;
        }
    } catch (e) {
        // Not JSON: the model header (if any) decides below.
    }
    return r.variables.turnout_model || '';
}

// failed applies the fail mode when turnout could not give a verdict.
function failed(r, body, reason) {
    if (r.variables.turnout_fail_mode === 'closed') {
        return answer(r, FAIL_CLOSED.status, FAIL_CLOSED.type, reason, FAIL_CLOSED.message);
    }
    r.variables.turnout_body_model = modelOf(r, body);
    r.variables.turnout_pool = r.variables.turnout_body_pool;
    r.variables.turnout_decision = '';
    r.internalRedirect(OPEN);
}

// insertAt applies turnout's body edit: the text (base64) goes in at byte
// offset at, just after the body's opening brace (route.BodyEdit); only
// JSON whitespace comes before that brace, so the byte offset is the
// string index. It returns null for an edit that does not fit the body.
function insertAt(body, ins64, at) {
    if (!(at >= 1 && at <= body.length) || body.charAt(at - 1) !== '{') {
        return null;
    }
    var ins = Buffer.from(ins64, 'base64').toString();
    if (!ins) {
        return null;
    }
    return body.slice(0, at) + ins + body.slice(at);
}

// verdict stores turnout's decision and redirects to the proxying location.
function verdict(r, res, body) {
    var h = res.headersOut;
    if (!h[REQUIRED_HEADER]) {
        return failed(r, body, BAD_ANSWER);
    }
    // Prefill/decode: the prefill already ran; the decode replica needs its
    // kv_transfer_params in the body. Checked before any variable is set:
    // a bad answer fails as a whole.
    var nb = null;
    var ins = h[EDIT.insert];
    if (ins) {
        try {
            nb = insertAt(body, ins, Number(h[EDIT.at]));
        } catch (e) {
            nb = null;
        }
        if (nb === null) {
            return failed(r, body, BAD_ANSWER);
        }
    }
    for (var i = 0; i < VERDICT_VARS.length; i++) {
        r.variables[VERDICT_VARS[i][1]] = h[VERDICT_VARS[i][0]] || '';
    }
    if (nb === null) {
        r.internalRedirect(PROXY);
        return;
    }
    r.variables.turnout_body = nb;
    r.internalRedirect(PROXY_PD);
}

// mayHoldModel: the body from index from on may hold a "model" key (plain
// or \u-escaped; a superset). turnout then gets the whole body and reads
// the model as the replica will (vLLM keeps the last key) instead of
// routing on a prefix that hides one.
function mayHoldModel(body, from) {
    return body.indexOf('model"', from) >= 0 || body.indexOf('\\u006', from) >= 0;
}

async function route(r) {
    var body;
    var args = '';
    try {
        body = r.requestText || '';
    } catch (e) {
        // The body went to a temporary file (it should not: the buffer is
        // the whole limit). Route on the headers and say so.
        body = '';
        args = 'truncated=0/' + (r.headersIn['Content-Length'] || '');
    }
    // turnout routes on a prefix (route_body) unless a prefill/decode
    // deployment needs the whole body: send no more than it uses. The whole
    // body still goes to the replica.
    var send = body;
    var limit = Number(r.variables.turnout_route_body) || 0;
    if (limit > 0 && body.length > limit && !mayHoldModel(body, limit - 6)) {
        send = body.slice(0, limit);
        args = 'truncated=' + send.length + '/' + body.length;
    }
    var res;
    try {
        res = await r.subrequest(ASK, {method: 'POST', body: send, args: args});
    } catch (e) {
        r.error('turnout: route subrequest: ' + e);
        return failed(r, body, 'route_error');
    }
    var st = res.status;
    if (st === 200 || st === 204) {
        return verdict(r, res, body);
    }
    var reason = res.headersOut[REASON_HEADER];
    if (reason) {
        // turnout answered: the contract's table says relay (a verdict
        // about the request, a prefill that ran and failed) or fail mode.
        if (action(st, reason) === 'relay') {
            return relay(r, res, reason);
        }
        return failed(r, body, reason);
    }
    return failed(r, body, st === 504 ? 'route_timeout' : 'route_unreachable');
}

// tft is the body filter of the locations that proxy to a replica
// (proxy.first_token_timing): the first response body bytes from the
// replica, which vLLM sends with the first token after its headers, set
// $turnout_tft to the milliseconds since the request arrived ($request_time
// at that moment) for the feedback line's tft=. Every chunk passes on as it
// came, with its flags (flush, last).
function tft(r, data, flags) {
    if (data.length > 0 && !r.variables.turnout_tft) {
        r.variables.turnout_tft = String(Math.round(Number(r.variables.request_time) * 1000));
    }
    r.sendBuffer(data, flags);
}

export default {route, insertAt, tft};
