package epp

import (
	"bytes"
	"errors"
	"iter"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// The gateway's ProcessingRequest decoded by hand from the wire, instead of
// into the go-control-plane tree by reflection: only what the picker reads
// (the phase, its headers, body and end_of_stream, protocol_config, the
// subset hint and the served endpoint in metadata_context), every other
// field skipped. The result views the message's bytes: nothing is copied.
// Merges follow protobuf's rules (a repeated message field adds, a oneof
// member switched clears the other, a map key replaces), so the result is
// what proto.Unmarshal and the getters give; decode_test.go checks both
// ways on random messages.

// procReq is one ProcessingRequest as the picker reads it.
type procReq struct {
	// phase is the request oneof's field (fReqRequestHeaders ...), 0 when
	// none was sent.
	phase protowire.Number
	// The phase's message: headers (HttpHeaders), body (HttpBody), and
	// end_of_stream of either.
	headers []hdrField
	body    []byte
	eos     bool

	hasConfig         bool
	reqMode, respMode filterv3.ProcessingMode_BodySendMode

	// hasSubset: envoy.lb.subset_hint has x-gateway-destination-endpoint-
	// subset; subset its addresses (untrimmed, empty ones included).
	hasSubset bool
	subset    [][]byte
	// served is envoy.lb's x-gateway-destination-endpoint-served string.
	served []byte

	lists [][]byte // scratch: a list_value's parts
}

// hdrField is a HeaderValue: its key and its value (raw_value, or value
// when raw_value is empty, as Envoy sends one or the other).
type hdrField struct{ name, value []byte }

var errTruncated = errors.New("truncated or malformed protobuf")

// reset empties r, keeping its slices' room.
func (r *procReq) reset() {
	*r = procReq{headers: r.headers[:0], subset: r.subset[:0], lists: r.lists[:0]}
}

// decodeRequest decodes b into r; r views b.
func decodeRequest(b []byte, r *procReq) error {
	r.reset()
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		if f.typ != protowire.BytesType {
			continue
		}
		switch f.num {
		case fReqRequestHeaders, fReqResponseHeaders, fReqRequestBody, fReqResponseBody, fReqRequestTrailers, fReqResponseTrailers:
			if f.num != r.phase { // another member of the oneof: the old one is gone
				r.phase, r.headers, r.body, r.eos = f.num, r.headers[:0], nil, false
			}
			switch f.num {
			case fReqRequestHeaders, fReqResponseHeaders:
				err = r.httpHeaders(f.v)
			case fReqRequestBody, fReqResponseBody:
				err = r.httpBody(f.v)
			}
		case fReqMetadata:
			err = r.metadata(f.v)
		case fReqProtocolConfig:
			r.hasConfig = true
			err = r.protocolConfig(f.v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// field is one field of a message: its number, type, and its value
// (bytes: the content; varint: in u).
type field struct {
	num protowire.Number
	typ protowire.Type
	v   []byte
	u   uint64
}

// isBytes: f is field num, length-delimited (a message, string or bytes).
func (f *field) isBytes(num protowire.Number) bool {
	return f.num == num && f.typ == protowire.BytesType
}

// isVarint: f is field num, a varint.
func (f *field) isVarint(num protowire.Number) bool {
	return f.num == num && f.typ == protowire.VarintType
}

// fields yields the fields of message b in order; a malformed one ends
// them with errTruncated. Groups and fixed-size values are skipped over.
func fields(b []byte) iter.Seq2[field, error] {
	return func(yield func(field, error) bool) {
		for len(b) > 0 {
			var f field
			num, typ, n := protowire.ConsumeTag(b)
			if n >= 0 {
				b = b[n:]
				f.num, f.typ = num, typ
				switch typ {
				case protowire.BytesType:
					f.v, n = protowire.ConsumeBytes(b)
				case protowire.VarintType:
					f.u, n = protowire.ConsumeVarint(b)
				default:
					n = protowire.ConsumeFieldValue(num, typ, b)
				}
			}
			if n < 0 {
				yield(field{}, errTruncated)
				return
			}
			b = b[n:]
			if !yield(f, nil) {
				return
			}
		}
	}
}

func (r *procReq) httpHeaders(b []byte) error {
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		switch {
		case f.isBytes(fHeadersMap):
			if err := r.headerMap(f.v); err != nil {
				return err
			}
		case f.isVarint(fHeadersEOS):
			r.eos = f.u != 0
		}
	}
	return nil
}

func (r *procReq) headerMap(b []byte) error {
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		if !f.isBytes(fMapHeaders) {
			continue
		}
		var key, value, raw []byte
		for hf, err := range fields(f.v) {
			if err != nil {
				return err
			}
			if hf.typ != protowire.BytesType {
				continue
			}
			switch hf.num {
			case fHeaderKey:
				key = hf.v
			case fHeaderValue:
				value = hf.v
			case fHeaderRawValue:
				raw = hf.v
			}
		}
		if len(raw) == 0 {
			raw = value
		}
		r.headers = append(r.headers, hdrField{name: key, value: raw})
	}
	return nil
}

func (r *procReq) httpBody(b []byte) error {
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		switch {
		case f.isBytes(fBodyBytes):
			r.body = f.v
		case f.isVarint(fBodyEOS):
			r.eos = f.u != 0
		}
	}
	return nil
}

func (r *procReq) protocolConfig(b []byte) error {
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		if f.typ != protowire.VarintType {
			continue
		}
		switch f.num {
		case fConfigRequestMode:
			r.reqMode = filterv3.ProcessingMode_BodySendMode(int32(f.u))
		case fConfigResponseMode:
			r.respMode = filterv3.ProcessingMode_BodySendMode(int32(f.u))
		}
	}
	return nil
}

// metadata reads a Metadata's filter_metadata: a namespace's entry
// replaces any earlier one of the same name.
func (r *procReq) metadata(b []byte) error {
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		if !f.isBytes(fMetadataFilter) {
			continue
		}
		ns, err := entryKey(f.v)
		if err != nil {
			return err
		}
		switch string(ns) {
		case NSSubset:
			err = r.subsetHint(f.v)
		case NSDestination:
			err = r.servedEndpoint(f.v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *procReq) subsetHint(ns []byte) error {
	r.hasSubset, r.subset = false, r.subset[:0]
	entry, ok, err := structField(ns, MetaSubset)
	if !ok || err != nil {
		return err
	}
	r.hasSubset = true
	k, err := r.value(entry)
	if err != nil {
		return err
	}
	switch k.kind {
	case fValueList:
		for _, l := range r.lists {
			for f, err := range fields(l) {
				if err != nil {
					return err
				}
				if !f.isBytes(fListValues) {
					continue
				}
				ek, err := r.valueParts(f.v, false)
				if err != nil {
					return err
				}
				if ek.kind == fValueString {
					r.subset = append(r.subset, ek.str)
				} else {
					r.subset = append(r.subset, nil)
				}
			}
		}
	case fValueString:
		// Not the protocol's list, but unambiguous: ip:port,ip:port.
		for a := range bytes.SplitSeq(k.str, []byte{','}) {
			r.subset = append(r.subset, a)
		}
	}
	return nil
}

func (r *procReq) servedEndpoint(ns []byte) error {
	r.served = nil
	entry, ok, err := structField(ns, MetaServed)
	if !ok || err != nil {
		return err
	}
	k, err := r.value(entry)
	if k.kind == fValueString {
		r.served = k.str
	}
	return err
}

// entryKey is a map entry's key (the last one sent, as protobuf reads it).
func entryKey(b []byte) ([]byte, error) {
	var key []byte
	for f, err := range fields(b) {
		if err != nil {
			return nil, err
		}
		if f.isBytes(fEntryKey) {
			key = f.v
		}
	}
	return key, nil
}

// structField is the map entry of key in the Struct of a map<string,
// Struct> entry: the last one, as a later key replaces an earlier one (a
// Struct sent in parts is one Struct).
func structField(entry []byte, key string) (found []byte, ok bool, err error) {
	for f, err := range fields(entry) {
		if err != nil {
			return nil, false, err
		}
		if !f.isBytes(fEntryValue) {
			continue
		}
		for sf, err := range fields(f.v) {
			if err != nil {
				return nil, false, err
			}
			if !sf.isBytes(fStructFields) {
				continue
			}
			k, err := entryKey(sf.v)
			if err != nil {
				return nil, false, err
			}
			if string(k) == key {
				found, ok = sf.v, true
			}
		}
	}
	return found, ok, nil
}

// valueKind is a Value's kind (the oneof's field sent last, 0 for none)
// and its string_value.
type valueKind struct {
	kind protowire.Number
	str  []byte
}

// value reads the Value of a map<string, Value> entry (sent in parts, it
// is one merged Value); the parts of its list_value are left in r.lists.
func (r *procReq) value(entry []byte) (valueKind, error) {
	var k valueKind
	r.lists = r.lists[:0]
	for f, err := range fields(entry) {
		if err != nil {
			return k, err
		}
		if !f.isBytes(fEntryValue) {
			continue
		}
		if err := r.readValue(&k, f.v, true); err != nil {
			return k, err
		}
	}
	return k, nil
}

// valueParts reads one Value (lists: keep its list_value parts in r.lists).
func (r *procReq) valueParts(b []byte, lists bool) (valueKind, error) {
	var k valueKind
	return k, r.readValue(&k, b, lists)
}

func (r *procReq) readValue(k *valueKind, b []byte, lists bool) error {
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		var ok bool
		switch f.num {
		case fValueNull, fValueBool:
			ok = f.typ == protowire.VarintType
		case fValueNumber:
			ok = f.typ == protowire.Fixed64Type
		case fValueString:
			if ok = f.typ == protowire.BytesType; ok {
				k.str = f.v
			}
		case fValueStruct:
			ok = f.typ == protowire.BytesType
		case fValueList:
			if ok = f.typ == protowire.BytesType; ok && lists {
				if k.kind != fValueList { // a new list
					r.lists = r.lists[:0]
				}
				r.lists = append(r.lists, f.v)
			}
		}
		if ok { // a field of the oneof: it is the kind now
			k.kind = f.num
		}
	}
	return nil
}
