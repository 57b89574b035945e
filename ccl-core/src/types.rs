//! NCCL's enumerations as typed Rust values (values identical to `nccl.h`).

use crate::error::{CclError, Result};

pub use crate::error::ResultCode;

/// `ncclDataType_t`.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    /// ncclInt8 / ncclChar
    Int8 = 0,
    /// ncclUint8
    Uint8 = 1,
    /// ncclInt32 / ncclInt
    Int32 = 2,
    /// ncclUint32
    Uint32 = 3,
    /// ncclInt64
    Int64 = 4,
    /// ncclUint64
    Uint64 = 5,
    /// ncclFloat16 / ncclHalf
    Float16 = 6,
    /// ncclFloat32 / ncclFloat
    Float32 = 7,
    /// ncclFloat64 / ncclDouble
    Float64 = 8,
    /// ncclBfloat16
    Bfloat16 = 9,
    /// ncclFloat8e4m3
    Float8e4m3 = 10,
    /// ncclFloat8e5m2
    Float8e5m2 = 11,
}

impl DataType {
    /// Every data type, in value order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// Converts a raw `ncclDataType_t`.
    pub fn from_raw(v: i32) -> Result<Self> {
        usize::try_from(v)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
            .ok_or_else(|| CclError::arg(format!("invalid data type {v}")))
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// nccl-tests' name of the type (`float`, `half`, `bfloat16`, `f8e4m3`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8e4m3
                | DataType::Float8e5m2
        )
    }
}

/// The built-in reduction of a `ncclRedOp_t` (PreMulSum ops created at run time map to
/// `PreMulSum` plus a scalar held by the communicator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOpKind {
    /// ncclSum
    Sum,
    /// ncclProd
    Prod,
    /// ncclMax
    Max,
    /// ncclMin
    Min,
    /// ncclAvg: sum, then divide by the number of ranks.
    Avg,
    /// Multiply each input by a scalar, then sum.
    PreMulSum,
}

impl RedOpKind {
    /// Converts one of the five built-in raw `ncclRedOp_t` values (0..=4).
    pub fn builtin_from_raw(v: i32) -> Option<Self> {
        match v {
            0 => Some(RedOpKind::Sum),
            1 => Some(RedOpKind::Prod),
            2 => Some(RedOpKind::Max),
            3 => Some(RedOpKind::Min),
            4 => Some(RedOpKind::Avg),
            _ => None,
        }
    }

    /// nccl-tests' name (`sum`, `prod`, `max`, `min`, `avg`, `mulsum`).
    pub fn name(self) -> &'static str {
        match self {
            RedOpKind::Sum => "sum",
            RedOpKind::Prod => "prod",
            RedOpKind::Max => "max",
            RedOpKind::Min => "min",
            RedOpKind::Avg => "avg",
            RedOpKind::PreMulSum => "mulsum",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_values_and_sizes() {
        for (i, d) in DataType::ALL.iter().enumerate() {
            assert_eq!(*d as i32, i as i32);
            assert_eq!(DataType::from_raw(i as i32).unwrap(), *d);
        }
        assert!(DataType::from_raw(12).is_err());
        assert!(DataType::from_raw(-1).is_err());
        assert_eq!(DataType::Bfloat16.size(), 2);
        assert_eq!(DataType::Float8e5m2.size(), 1);
        assert_eq!(DataType::Uint64.size(), 8);
    }

    #[test]
    fn builtin_redops() {
        assert_eq!(RedOpKind::builtin_from_raw(4), Some(RedOpKind::Avg));
        assert_eq!(RedOpKind::builtin_from_raw(5), None);
    }
}
