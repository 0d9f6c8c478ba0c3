//! `EwLine`: exponentially weighted least-squares sums of (x, y) samples and the lines they give, `y = a + b x`:
//! with an intercept when the samples pin one down, through the origin, level (b = 0), or another line's shape
//! scaled to these samples. The prefill (`throughput`) and decode (`decode`) speeds are both such lines. Pure.

/// Weight of a new sample in the running sums (about the last 1/WEIGHT samples count).
const WEIGHT: f64 = 0.05;

/// Running exponentially weighted sums of one endpoint's samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EwLine {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    yy: f64,
    /// Sum of the squared weights: `w² / ww` is the effective number of samples.
    ww: f64,
}

/// `y = intercept + slope × x`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    pub intercept: f64,
    pub slope: f64,
}

impl Line {
    pub fn at(&self, x: f64) -> f64 {
        self.intercept + self.slope * x
    }
}

impl EwLine {
    /// One sample; samples that are not finite, or not positive in `y` or negative in `x`, are ignored.
    pub fn observe(&mut self, x: f64, y: f64) {
        if !(x.is_finite() && y.is_finite() && x >= 0.0 && y > 0.0) {
            return;
        }
        let keep = 1.0 - WEIGHT;
        self.w = self.w * keep + WEIGHT;
        self.x = self.x * keep + WEIGHT * x;
        self.y = self.y * keep + WEIGHT * y;
        self.xx = self.xx * keep + WEIGHT * x * x;
        self.xy = self.xy * keep + WEIGHT * x * y;
        self.yy = self.yy * keep + WEIGHT * y * y;
        self.ww = self.ww * keep * keep + WEIGHT * WEIGHT;
    }

    /// Any sample seen.
    pub fn is_empty(&self) -> bool {
        self.w <= 0.0
    }

    /// The weighted means of x and y; None before any sample.
    pub fn means(&self) -> Option<(f64, f64)> {
        (self.w > 0.0).then(|| (self.x / self.w, self.y / self.w))
    }

    /// The line with an intercept, when the samples spread at least `min_spread` (standard deviation of x over
    /// its mean) and pin its slope down (standard error at most `max_slope_error` of the slope), with a positive
    /// slope and an intercept of at least 0; None otherwise.
    pub fn with_intercept(&self, min_spread: f64, max_slope_error: f64) -> Option<Line> {
        let (mx, my) = self.means()?;
        if mx <= 0.0 || self.xx <= 0.0 {
            return None;
        }
        let var = (self.xx / self.w - mx * mx).max(0.0);
        if var.sqrt() < min_spread * mx {
            return None;
        }
        let cov = self.xy / self.w - mx * my;
        let slope = cov / var;
        let intercept = my - slope * mx;
        (slope > 0.0
            && intercept >= 0.0
            && self.slope_error(var, cov, my) <= max_slope_error * slope)
            .then_some(Line { intercept, slope })
    }

    /// The least-squares line through the origin; None before any sample with x > 0.
    pub fn through_origin(&self) -> Option<Line> {
        let slope = self.xy / self.xx;
        (self.xx > 0.0 && slope > 0.0 && slope.is_finite()).then_some(Line {
            intercept: 0.0,
            slope,
        })
    }

    /// The level line at the mean of y; None before any sample.
    pub fn level(&self) -> Option<Line> {
        let (_, my) = self.means()?;
        (my > 0.0 && my.is_finite()).then_some(Line {
            intercept: my,
            slope: 0.0,
        })
    }

    /// `shape` scaled by the factor `k` that fits these samples best (`y ≈ k × shape(x)`, least squares): the
    /// shape's intercept-to-slope proportion, these samples' level. None before any sample.
    pub fn scaled(&self, shape: Line) -> Option<Line> {
        let (a, b) = (shape.intercept, shape.slope);
        let gy = a * self.y + b * self.xy;
        let gg = a * a * self.w + 2.0 * a * b * self.x + b * b * self.xx;
        let k = gy / gg;
        (self.w > 0.0 && k.is_finite() && k > 0.0).then_some(Line {
            intercept: k * a,
            slope: k * b,
        })
    }

    /// Standard error of the fitted slope (infinite with fewer than three effective samples).
    fn slope_error(&self, var_x: f64, cov: f64, mean_y: f64) -> f64 {
        let n = if self.ww > 0.0 {
            self.w * self.w / self.ww
        } else {
            0.0
        };
        if n <= 2.0 {
            return f64::INFINITY;
        }
        let var_y = (self.yy / self.w - mean_y * mean_y).max(0.0);
        let residual = (var_y - cov * cov / var_x).max(0.0) * n / (n - 2.0);
        (residual / (n * var_x)).sqrt()
    }
}

/// The median by `key` of `lines` (the upper one of an even count); None when empty.
pub fn median_by(mut lines: Vec<Line>, key: impl Fn(&Line) -> f64) -> Option<Line> {
    lines.sort_by(|a, b| key(a).total_cmp(&key(b)));
    lines.get(lines.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_from_the_same_sums() {
        let mut f = EwLine::default();
        assert!(f.is_empty() && f.level().is_none() && f.through_origin().is_none());
        for i in 0..200 {
            let x = (i % 10) as f64 + 1.0;
            f.observe(x, 0.02 + 0.001 * x);
        }
        let l = f.with_intercept(0.25, 0.25).unwrap();
        assert!(
            (l.intercept - 0.02).abs() < 1e-6 && (l.slope - 0.001).abs() < 1e-7,
            "{l:?}"
        );
        let level = f.level().unwrap();
        assert_eq!(level.slope, 0.0);
        assert!((level.intercept - f.means().unwrap().1).abs() < 1e-12);
        // Twice the shape's level: the proportion kept, the scale fitted.
        let s = f
            .scaled(Line {
                intercept: 0.04,
                slope: 0.002,
            })
            .unwrap();
        assert!(
            (s.intercept - 0.02).abs() < 1e-6 && (s.slope - 0.001).abs() < 1e-7,
            "{s:?}"
        );
        // Bad samples are ignored.
        let before = f;
        f.observe(f64::NAN, 1.0);
        f.observe(1.0, 0.0);
        f.observe(-1.0, 1.0);
        assert_eq!(f, before);
    }
}
