// turnout njs glue for nginx body mode. Written next to nginx.conf by
// `turnout render nginx` (as turnout.js); edits are overwritten on the next sync.
//
// route() is the content handler of body-mode requests. nginx has read the
// whole body into memory (client_body_buffer_size = client_max_body_size),
// so it travels with the routing headers to turnout in a subrequest; the
// verdict goes into js_var variables, which survive the internal redirect to
// the location that proxies the request. No policy lives here: the code only
// carries turnout's inputs and verdict, relays its refusals, applies the fail
// mode and, for prefill/decode, builds the decode body.
//
// Inputs from nginx.conf: $turnout_fail_mode (open|closed),
// $turnout_unread_reasons, and the maps
// $turnout_body_pool / $turnout_body_pd keyed by $turnout_body_model.

var ASK = '/_turnout/ask_body';
var PROXY = '@turnout_proxy';
var PROXY_PD = '@turnout_proxy_pd';
var OPEN = '@turnout_open';

// Reasons end up in a response header: keep them to a plain token.
function token(s) {
    return String(s).replace(/[^A-Za-z0-9_.-]/g, '').slice(0, 64) || 'unknown';
}

// unread reports a 4xx reason that says turnout could not read the call
// (e.g. headers over its limit): not a verdict about the request.
function unread(r, reason) {
    return (r.variables.turnout_unread_reasons || '').split(' ').indexOf(reason) >= 0;
}

function errorJSON(message, type, code) {
    return JSON.stringify({error: {message: message, type: type, code: code}});
}

// answer ends the request with an OpenAI-style error of turnout's glue.
function answer(r, status, type, reason, message) {
    reason = token(reason);
    r.headersOut['Content-Type'] = 'application/json';
    r.headersOut['X-Turnout-Reason'] = reason;
    r.return(status, errorJSON(message, type, reason));
}

// relay hands turnout's own refusal to the client: status, reason, JSON body.
function relay(r, res, reason) {
    var h = res.headersOut;
    r.headersOut['Content-Type'] = h['Content-Type'] || 'application/json';
    r.headersOut['X-Turnout-Reason'] = token(reason);
    if (h['Retry-After']) {
        r.headersOut['Retry-After'] = h['Retry-After'];
    }
    r.return(res.status, res.responseText || '');
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
        return answer(r, 503, 'service_unavailable', reason, 'routing unavailable');
    }
    r.variables.turnout_body_model = modelOf(r, body);
    r.variables.turnout_pool = r.variables.turnout_body_pool;
    r.variables.turnout_decision = '';
    r.internalRedirect(OPEN);
}

function isWS(c) {
    return c === ' ' || c === '\t' || c === '\n' || c === '\r';
}

// decodeBody injects kv_transfer_params (a JSON object as text) right after
// the body's opening brace, exactly as route.DecodeBody does; every other
// byte is kept. It returns null when body or kv does not start like an
// object; that the body is one whole object turnout checked before the prefill.
function decodeBody(body, kv) {
    var i = 0;
    while (i < body.length && isWS(body.charAt(i))) {
        i++;
    }
    if (body.charAt(i) !== '{' || kv.charAt(0) !== '{') {
        return null;
    }
    var j = i + 1;
    while (j < body.length && isWS(body.charAt(j))) {
        j++;
    }
    var sep = body.charAt(j) === '}' ? '' : ',';
    return body.slice(0, i + 1) + '"kv_transfer_params":' + kv + sep + body.slice(i + 1);
}

// verdict stores turnout's decision and redirects to the proxying location.
function verdict(r, res, body) {
    var h = res.headersOut;
    var srv = h['X-Turnout-Server'];
    if (!srv) {
        return failed(r, body, 'route_bad_answer');
    }
    r.variables.turnout_server = srv;
    r.variables.turnout_backend = h['X-Turnout-Backend'] || '';
    r.variables.turnout_pool = h['X-Turnout-Pool'] || '';
    r.variables.turnout_decision = h['X-Turnout-Decision'] || '';
    var kv = h['X-Turnout-Kv-Transfer'];
    if (!kv) {
        r.internalRedirect(PROXY);
        return;
    }
    // Prefill/decode: the prefill already ran; the decode replica needs its
    // kv_transfer_params in the body. Nothing has been sent to decode yet,
    // so a bad header is a clean 502.
    var nb = null;
    try {
        nb = decodeBody(body, Buffer.from(kv, 'base64').toString());
    } catch (e) {
        nb = null;
    }
    if (nb === null) {
        r.variables.turnout_decision = '';
        return answer(r, 502, 'server_error', 'kv_transfer_invalid',
            'turnout sent kv_transfer_params that are not a JSON object');
    }
    r.variables.turnout_body = nb;
    r.internalRedirect(PROXY_PD);
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
    if (limit > 0 && body.length > limit) {
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
    var reason = res.headersOut['X-Turnout-Reason'];
    if (reason) {
        // turnout answered: refusals (4xx) are about the request, and a
        // prefill/decode failure (502/503) must not be served without its
        // prefill, so both reach the client as they are.
        if (st >= 400 && st < 500) {
            if (unread(r, reason)) {
                return failed(r, body, reason);
            }
            return relay(r, res, reason);
        }
        r.variables.turnout_body_model = modelOf(r, body);
        if (r.variables.turnout_body_pd === '1') {
            return relay(r, res, reason);
        }
        return failed(r, body, reason);
    }
    return failed(r, body, st === 504 ? 'route_timeout' : 'route_unreachable');
}

export default {route, decodeBody};
