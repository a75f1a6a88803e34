//! bfloat16 as raw `u16` words (the kernels take bf16 buffers as 16-bit words).

/// Round an `f32` to the nearest bf16 (ties to even); NaN stays NaN.
pub fn from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// The `f32` value of a bf16 word (exact).
pub fn to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// The bf16 word used to poison outputs before a run: a quiet NaN no kernel result can equal.
pub const POISON: u16 = 0xffff;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_values_round_trip() {
        for x in [0.0f32, 1.0, -2.5, 0.125, 3.0e38, -1.0e-30] {
            let h = from_f32(x);
            let back = to_f32(h);
            assert!((back - x).abs() <= x.abs() / 128.0, "{x} -> {back}");
        }
        assert_eq!(from_f32(1.0), 0x3f80);
        assert_eq!(from_f32(-2.0), 0xc000);
    }

    #[test]
    fn rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0.
        assert_eq!(from_f32(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even) -> up.
        assert_eq!(from_f32(1.0 + 3.0 / 256.0), 0x3f82);
        assert!(to_f32(POISON).is_nan());
        assert!(to_f32(from_f32(f32::NAN)).is_nan());
    }
}
