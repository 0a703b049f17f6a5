package epp

import "google.golang.org/protobuf/encoding/protowire"

// Field numbers of the messages the picker reads (decode.go) and writes
// (wire.go), by message: envoy/service/ext_proc/v3, envoy/config/core/v3,
// google/protobuf/struct.proto.
const (
	fReqRequestHeaders    protowire.Number = 2 // ProcessingRequest
	fReqResponseHeaders   protowire.Number = 3
	fReqRequestBody       protowire.Number = 4
	fReqResponseBody      protowire.Number = 5
	fReqRequestTrailers   protowire.Number = 6
	fReqResponseTrailers  protowire.Number = 7
	fReqMetadata          protowire.Number = 8
	fReqProtocolConfig    protowire.Number = 11
	fRespRequestHeaders   protowire.Number = 1 // ProcessingResponse
	fRespResponseHeaders  protowire.Number = 2
	fRespRequestBody      protowire.Number = 3
	fRespResponseBody     protowire.Number = 4
	fRespRequestTrailers  protowire.Number = 5
	fRespResponseTrailers protowire.Number = 6
	fRespDynamicMetadata  protowire.Number = 8
	fHeadersMap           protowire.Number = 1 // HttpHeaders
	fHeadersEOS           protowire.Number = 3
	fMapHeaders           protowire.Number = 1 // HeaderMap
	fHeaderKey            protowire.Number = 1 // HeaderValue
	fHeaderValue          protowire.Number = 2
	fHeaderRawValue       protowire.Number = 3
	fBodyBytes            protowire.Number = 1 // HttpBody
	fBodyEOS              protowire.Number = 2
	fConfigRequestMode    protowire.Number = 1 // ProtocolConfiguration
	fConfigResponseMode   protowire.Number = 2
	fPhaseResponse        protowire.Number = 1 // HeadersResponse, BodyResponse
	fCommonHeaders        protowire.Number = 2 // CommonResponse
	fCommonBody           protowire.Number = 3
	fCommonClearCache     protowire.Number = 5
	fMutationSet          protowire.Number = 1 // HeaderMutation.set_headers
	fOptionHeader         protowire.Number = 1 // HeaderValueOption
	fOptionAppendAction   protowire.Number = 3
	fBodyStreamed         protowire.Number = 3 // BodyMutation.streamed_response
	fStreamedBody         protowire.Number = 1 // StreamedBodyResponse
	fStreamedEOS          protowire.Number = 2
	fMetadataFilter       protowire.Number = 1 // Metadata.filter_metadata
	fStructFields         protowire.Number = 1 // Struct.fields (map entries)
	fEntryKey             protowire.Number = 1
	fEntryValue           protowire.Number = 2
	fValueNull            protowire.Number = 1 // Value
	fValueNumber          protowire.Number = 2
	fValueString          protowire.Number = 3
	fValueBool            protowire.Number = 4
	fValueStruct          protowire.Number = 5
	fValueList            protowire.Number = 6
	fListValues           protowire.Number = 1 // ListValue

	// HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
	overwriteOrAdd = 2
)
