//! Box statistics against values worked out by hand (numpy's linear quantiles,
//! matplotlib's 1.5 IQR whiskers).

use hmct_plot::{BoxStats, PlotError, channel_stats};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn quartiles_whiskers_and_outliers_by_hand() {
    // Sorted 1..9, 100. Positions q*(n-1): 2.25, 4.5, 6.75.
    let v = [5.0, 100.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0];
    let s = BoxStats::from_values(&v, 10).unwrap();
    assert_eq!(s.count, 10);
    assert!(close(s.q1, 3.25), "{}", s.q1);
    assert!(close(s.median, 5.5), "{}", s.median);
    assert!(close(s.q3, 7.75), "{}", s.q3);
    assert!(close(s.mean, 14.5), "{}", s.mean);
    // IQR 4.5: fences at -3.5 and 14.5.
    assert!(close(s.whisker_low, 1.0));
    assert!(close(s.whisker_high, 9.0));
    assert_eq!(s.outliers, vec![100.0]);
    assert_eq!(s.outliers_total, 1);
    assert!(close(s.min, 1.0) && close(s.max, 100.0));
}

#[test]
fn even_count_interpolates() {
    // [1, 2, 3, 4]: positions 0.75, 1.5, 2.25.
    let s = BoxStats::from_values(&[4.0, 3.0, 2.0, 1.0], 10).unwrap();
    assert!(close(s.q1, 1.75) && close(s.median, 2.5) && close(s.q3, 3.25));
    assert!(close(s.whisker_low, 1.0) && close(s.whisker_high, 4.0));
    assert!(s.outliers.is_empty());
}

#[test]
fn single_value_and_low_outliers() {
    let s = BoxStats::from_values(&[2.5], 10).unwrap();
    assert!(close(s.q1, 2.5) && close(s.q3, 2.5) && close(s.whisker_low, 2.5));
    // Sorted -50, 10..=18: q1 at 2.25 -> 11.25, q3 at 6.75 -> 15.75; fence 11.25 - 6.75.
    let mut v: Vec<f32> = (10..=18).map(|x| x as f32).collect();
    v.push(-50.0);
    let s = BoxStats::from_values(&v, 10).unwrap();
    assert!(close(s.q1, 11.25) && close(s.q3, 15.75));
    assert!(close(s.whisker_low, 10.0));
    assert_eq!(s.outliers, vec![-50.0]);
}

#[test]
fn non_finite_values_are_left_out() {
    // Finite part [1, 2, 3]: q1 at 0.5 -> 1.5.
    let s = BoxStats::from_values(&[f32::NAN, 3.0, f32::INFINITY, 1.0, 2.0], 10).unwrap();
    assert_eq!((s.count, s.non_finite), (3, 2));
    assert!(close(s.q1, 1.5) && close(s.median, 2.0) && close(s.q3, 2.5));
    assert!(matches!(
        BoxStats::from_values(&[f32::NAN], 10),
        Err(PlotError::NoFiniteData(_))
    ));
    assert!(matches!(
        BoxStats::from_values(&[], 10),
        Err(PlotError::EmptyData(_))
    ));
}

#[test]
fn outlier_cap_is_deterministic_and_keeps_extremes() {
    // 1000 zeros with 30 values far below and 70 far above.
    let mut v = vec![0.0f32; 1000];
    v.extend((1..=30).map(|k| -100.0 - k as f32));
    v.extend((1..=70).map(|k| 100.0 + k as f32));
    let s = BoxStats::from_values(&v, 10).unwrap();
    assert_eq!(s.outliers_total, 100);
    assert_eq!(s.outliers.len(), 10);
    assert_eq!(s.outliers.first(), Some(&-130.0));
    assert_eq!(s.outliers.last(), Some(&170.0));
    assert!(s.outliers.windows(2).all(|w| w[0] <= w[1]), "sorted");
    // Both sides represented, in proportion.
    let below = s.outliers.iter().filter(|o| **o < 0.0).count();
    assert_eq!(below, 3);
    let mut shuffled = v.clone();
    shuffled.reverse();
    assert_eq!(BoxStats::from_values(&shuffled, 10).unwrap(), s);
    // A cap of one keeps the point furthest from the box.
    let one = BoxStats::from_values(&v, 1).unwrap();
    assert_eq!(one.outliers, vec![170.0]);
}

#[test]
fn channels_along_an_axis() {
    // Shape [2, 3, 2], channel axis 1: channel c holds (o, c, i) for o, i in 0..2.
    let v: Vec<f32> = (0..12).map(|x| x as f32).collect();
    let stats = channel_stats(&v, &[2, 3, 2], 1, 10).unwrap();
    assert_eq!(stats.len(), 3);
    // Channel 1: elements 2, 3, 8, 9.
    assert!(close(stats[1].min, 2.0) && close(stats[1].max, 9.0));
    assert!(close(stats[1].mean, 5.5));
    assert_eq!(
        stats.iter().map(|s| s.count).collect::<Vec<_>>(),
        vec![4, 4, 4]
    );
    // Axis 0 of [3, 2]: rows.
    let rows = channel_stats(&v[..6], &[3, 2], 0, 10).unwrap();
    assert!(close(rows[2].median, 4.5));
    assert!(matches!(
        channel_stats(&v, &[2, 3, 2], 3, 10),
        Err(PlotError::InvalidSpec(_))
    ));
    assert!(matches!(
        channel_stats(&v, &[5, 2], 0, 10),
        Err(PlotError::InvalidSpec(_))
    ));
}
