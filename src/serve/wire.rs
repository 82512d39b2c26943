//! What `dpfusion serve` tells a client beyond rows (docs/SQL.md, "Receipts and error codes
//! over Flight SQL"): each result's receipt, as JSON, and each error's machine-readable code.
//!
//! - **Receipts.** A statement's [`StatementMetadata`] (the charge as
//!   [`crate::accounting::Receipt`] serialised whole, the REPL's receipt text, the private
//!   tables used) travels three ways, so that every client reaches one: the `FlightInfo`'s
//!   `app_metadata`, the `app_metadata` of the result stream's first (schema) message, and the
//!   result's Arrow schema metadata under [`RECEIPT_KEY`] — the one the ADBC Flight SQL driver
//!   hands to pyarrow (`table.schema.metadata[b"dpfusion.receipt"]`).
//! - **Error codes.** An error of a statement carries its [`ErrorCode`] twice: in the gRPC status
//!   details (`grpc-status-details-bin`: a `google.rpc.Status` holding one
//!   `google.rpc.ErrorInfo` with domain [`DOMAIN`], reason the code in capitals and metadata
//!   `code` the code), and in the response metadata [`CODE_HEADER`], which the ADBC driver lists
//!   in a Python exception's `details`. The gRPC code is the status class: a budget refusal is
//!   `FailedPrecondition` (the state of the table's budget, not the request, is what fails; ADBC
//!   maps it to `INVALID_STATE`, a `ProgrammingError` in Python), never `Internal` (a crash's).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

/// The key of a result's Arrow schema metadata that holds its [`StatementMetadata`] (JSON).
pub const RECEIPT_KEY: &str = "dpfusion.receipt";

/// The response metadata key that holds an error's [`ErrorCode`].
pub const CODE_HEADER: &str = "x-dpfusion-code";

/// The `google.rpc.ErrorInfo` domain of dpfusion's errors.
pub const DOMAIN: &str = "dpfusion";

/// What kind of error a statement met: the machine-readable code a client branches on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Admitting the statement would exceed a table's budget; nothing was charged or read.
    BudgetExceeded,
    /// The guard or the server refused the statement (outside the private fragment, a statement
    /// the server does not run, a full quota); nothing was charged.
    Refused,
    /// The SQL or an argument is invalid; nothing was charged or read.
    Invalid,
    /// The statement failed after admission; its charge stands, and no detail is shown.
    ExecutionFailed,
}

impl ErrorCode {
    /// The code as sent (`budget_exceeded`, `refused`, `invalid`, `execution_failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BudgetExceeded => "budget_exceeded",
            ErrorCode::Refused => "refused",
            ErrorCode::Invalid => "invalid",
            ErrorCode::ExecutionFailed => "execution_failed",
        }
    }

    /// The code sent as `s`.
    pub fn parse(s: &str) -> Option<Self> {
        [
            ErrorCode::BudgetExceeded,
            ErrorCode::Refused,
            ErrorCode::Invalid,
            ErrorCode::ExecutionFailed,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    /// The gRPC status code a statement's error of this kind is sent with.
    pub fn grpc(self) -> Code {
        match self {
            ErrorCode::BudgetExceeded => Code::FailedPrecondition,
            ErrorCode::Refused | ErrorCode::Invalid => Code::InvalidArgument,
            ErrorCode::ExecutionFailed => Code::Internal,
        }
    }
}

/// `google.rpc.Status` (googleapis google/rpc/status.proto), the body of
/// `grpc-status-details-bin`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<ProtoAny>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.ErrorInfo` (googleapis google/rpc/error_details.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(map = "string, string", tag = "3")]
    metadata: HashMap<String, String>,
}

const ERROR_INFO_URL: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// A status of `grpc` code with `message`, carrying `code` in its details and metadata.
pub fn coded(grpc: Code, code: ErrorCode, message: String) -> Status {
    use prost::Message;
    let info = ErrorInfo {
        reason: code.as_str().to_ascii_uppercase(),
        domain: DOMAIN.to_string(),
        metadata: HashMap::from([("code".to_string(), code.as_str().to_string())]),
    };
    let body = RpcStatus {
        code: grpc as i32,
        message: message.clone(),
        details: vec![ProtoAny {
            type_url: ERROR_INFO_URL.to_string(),
            value: info.encode_to_vec(),
        }],
    };
    let mut meta = tonic::metadata::MetadataMap::new();
    meta.insert(
        CODE_HEADER,
        tonic::metadata::MetadataValue::from_static(code.as_str()),
    );
    Status::with_details_and_metadata(grpc, message, body.encode_to_vec().into(), meta)
}

/// The [`ErrorCode`] a status carries (its details, else its metadata), if any.
pub fn code_of(status: &Status) -> Option<ErrorCode> {
    use prost::Message;
    let from_details = RpcStatus::decode(status.details())
        .ok()
        .into_iter()
        .flat_map(|s| s.details)
        .filter(|d| d.type_url == ERROR_INFO_URL)
        .filter_map(|d| ErrorInfo::decode(d.value.as_slice()).ok())
        .filter(|i| i.domain == DOMAIN)
        .find_map(|i| i.metadata.get("code").and_then(|c| ErrorCode::parse(c)));
    from_details.or_else(|| {
        status
            .metadata()
            .get(CODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(ErrorCode::parse)
    })
}

/// What a statement's result carries beside its rows (JSON; docs/SQL.md).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StatementMetadata {
    /// The charge ([`crate::accounting::Receipt`] serialised), null when nothing was charged.
    pub receipt: Option<serde_json::Value>,
    /// The same receipt as the REPL prints it.
    pub receipt_text: Option<String>,
    /// The private tables the statement used.
    pub tables: Vec<String>,
}

impl StatementMetadata {
    /// The metadata of a statement's result.
    pub fn of(result: &crate::session::QueryResult) -> Self {
        Self {
            receipt: result
                .receipt
                .as_ref()
                .and_then(|r| serde_json::to_value(r).ok()),
            receipt_text: result.receipt.as_ref().map(crate::statements::receipt_line),
            tables: result.tables.clone(),
        }
    }

    /// As JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_string())
    }
}

/// Refuses an uploaded Arrow IPC message (an ingest's rows, a statement's parameters) that the
/// server would have to expand before it could count it: a compressed record or dictionary
/// batch (arrow-ipc decompresses a message whole, to the length the sender writes in it,
/// before any quota sees the batch: 290 KB of zstd asked for 9.6 GB and aborted the process,
/// review r45), and a delta dictionary (it grows a dictionary the quota never counts; a
/// dictionary that replaces another is counted with the batches that use it).
pub fn plain_ipc(d: arrow_flight::FlightData) -> Result<arrow_flight::FlightData, Status> {
    use datafusion::arrow::ipc::root_as_message;
    if d.data_header.is_empty() {
        return Ok(d);
    }
    let refuse = |why: &str| {
        Err(coded(
            Code::InvalidArgument,
            ErrorCode::Invalid,
            format!(
                "the upload holds {why}, which this server does not accept: send Arrow IPC \
                 without compression (IpcWriteOptions(compression=None)) and without delta \
                 dictionaries"
            ),
        ))
    };
    let Ok(m) = root_as_message(&d.data_header) else {
        return refuse("a message that is not an Arrow IPC message");
    };
    if m.header_as_record_batch()
        .is_some_and(|b| b.compression().is_some())
    {
        return refuse("a compressed record batch");
    }
    if let Some(dict) = m.header_as_dictionary_batch() {
        if dict.isDelta() {
            return refuse("a delta dictionary");
        }
        if dict.data().is_some_and(|b| b.compression().is_some()) {
            return refuse("a compressed dictionary");
        }
    }
    Ok(d)
}

/// Is `d` an Arrow IPC dictionary batch?
pub fn is_dictionary(d: &arrow_flight::FlightData) -> bool {
    datafusion::arrow::ipc::root_as_message(&d.data_header)
        .is_ok_and(|m| m.header_as_dictionary_batch().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review r45: a compressed batch is refused before arrow-ipc expands it (290 KB of zstd
    /// was 9.6 GB); the same batch uncompressed, and a schema message, pass.
    #[tokio::test]
    async fn compressed_uploads_are_refused_before_they_are_expanded() {
        use arrow_flight::encode::FlightDataEncoderBuilder;
        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::ipc::CompressionType;
        use datafusion::arrow::ipc::writer::IpcWriteOptions;
        use futures::TryStreamExt;
        let batch = RecordBatch::try_from_iter(vec![(
            "a",
            std::sync::Arc::new(Int64Array::from(vec![0i64; 100_000])) as _,
        )])
        .unwrap();
        let encode = |compression| {
            let options = IpcWriteOptions::default()
                .try_with_compression(compression)
                .unwrap();
            FlightDataEncoderBuilder::new()
                .with_options(options)
                .build(futures::stream::iter([Ok(batch.clone())]))
                .try_collect::<Vec<_>>()
        };
        let plain = encode(None).await.unwrap();
        assert_eq!(plain.len(), 2, "a schema and a batch");
        assert!(plain.into_iter().all(|d| plain_ipc(d).is_ok()));
        for c in [CompressionType::ZSTD, CompressionType::LZ4_FRAME] {
            let mut messages = encode(Some(c)).await.unwrap().into_iter();
            assert!(plain_ipc(messages.next().unwrap()).is_ok(), "the schema");
            let e = plain_ipc(messages.next().unwrap()).unwrap_err();
            assert_eq!(code_of(&e), Some(ErrorCode::Invalid));
            assert!(e.message().contains("compressed record batch"), "{e:?}");
        }
    }

    #[test]
    fn codes_round_trip_through_a_status() {
        for code in [
            ErrorCode::BudgetExceeded,
            ErrorCode::Refused,
            ErrorCode::Invalid,
            ErrorCode::ExecutionFailed,
        ] {
            let s = coded(code.grpc(), code, "why".into());
            assert_eq!(code_of(&s), Some(code));
            assert_eq!(s.code(), code.grpc());
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            // The metadata alone is enough too.
            let bare = Status::with_metadata(code.grpc(), "why", s.metadata().clone());
            assert_eq!(code_of(&bare), Some(code));
        }
        assert_eq!(code_of(&Status::internal("x")), None);
        assert_ne!(ErrorCode::BudgetExceeded.grpc(), Code::Internal);
    }
}
