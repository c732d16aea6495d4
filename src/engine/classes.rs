//! Which class names fit a model: one per output channel, channel `c` naming label value `c`. A
//! one-channel model (a sigmoid foreground) writes labels 0 and 1, so it takes one name (its
//! foreground, label 1: the older form) or two (label 0, the background, first), the way
//! MONAI bundles and nnU-Net list them.

/// Whether `names` class names fit a model of `channels` output channels.
pub fn classes_fit(names: usize, channels: usize) -> bool {
    names == channels || (channels == 1 && names == 2)
}

/// The class name of label value `value` (before remapping) of a model of `channels` output
/// channels, from `classes` (the manifest's, checked by [`classes_fit`]).
pub fn class_name(classes: &[String], channels: usize, value: usize) -> Option<&String> {
    if channels == 1 && classes.len() == 1 {
        classes.first().filter(|_| value == 1)
    } else {
        classes.get(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_channel_model_takes_one_name_or_two() {
        assert!(classes_fit(1, 1) && classes_fit(2, 1) && classes_fit(3, 3));
        assert!(!classes_fit(3, 1) && !classes_fit(2, 3) && !classes_fit(1, 2));
        let one = ["brain".to_string()];
        let two = ["background".to_string(), "brain".to_string()];
        assert_eq!(class_name(&one, 1, 1), Some(&one[0]));
        assert_eq!(class_name(&one, 1, 0), None);
        assert_eq!(class_name(&two, 1, 0), Some(&two[0]));
        assert_eq!(class_name(&two, 1, 1), Some(&two[1]));
        assert_eq!(class_name(&two, 2, 1), Some(&two[1]));
    }
}
