"""Over two hundred lay-language symptom phrases, the way patients and intake forms put them.

For demos (`--demo-rows N`) and the load generator: the API has no way to list a source's concepts for a
client, so realistic rows ship here. Written for this project; no source data is copied.
"""

PHRASES = (
    # head, brain and nerves
    'pounding headache', 'headache behind the eyes', 'migraine with flashing lights',
    'dizzy when standing up', 'room spinning', 'fainted at work', 'blacked out for a few seconds',
    'memory getting worse',
    'trouble finding words', 'confused and disoriented', 'numbness in my fingers', 'tingling in both feet',
    'pins and needles in my hands', 'weak left arm', 'face drooping on one side', 'slurred speech',
    'hands shaking', 'uncontrollable trembling', 'seizure with jerking', 'twitching eyelid',
    'cannot sleep at night', 'sleepy all day', 'wakes up gasping for air', 'loud snoring',
    'restless legs at night', 'feeling off balance', 'falls a lot', 'clumsy hands',
    'stiff neck and fever', 'sensitive to light',
    # eyes, ears, nose, throat
    'blurry vision', 'seeing double', 'red itchy eyes', 'eye pain', 'floaters in vision',
    'losing vision in one eye', 'dry gritty eyes', 'ringing in the ears', 'hard of hearing',
    'earache', 'fluid coming out of ear', 'blocked nose', 'runny nose', 'nosebleeds',
    'lost sense of smell', 'sore throat', 'hoarse voice', 'trouble swallowing',
    'food gets stuck in throat', 'swollen glands in neck', 'mouth ulcers', 'bleeding gums',
    'toothache', 'dry mouth', 'bad breath',
    # chest, heart and breathing
    'chest pain', 'tight chest', 'crushing chest pressure', 'heart racing', 'skipped heartbeats',
    'heart pounding', 'short of breath', 'out of breath climbing stairs', 'cannot lie flat to breathe',
    'wheezing', 'chronic cough', 'coughing up blood', 'coughing up phlegm', 'dry cough at night',
    'swollen ankles', 'legs swell by evening', 'cold hands and feet', 'calf pain when walking',
    'high blood pressure', 'low blood pressure', 'chest pain when breathing in',
    # stomach and digestion
    'stomach ache', 'cramping belly pain', 'pain in the lower right side of the belly', 'heartburn',
    'acid coming up', 'feeling sick to my stomach', 'throwing up', 'vomiting blood', 'bloated all the time',
    'lots of gas', 'diarrhea for a week', 'loose stools', 'constipated', 'blood in stool',
    'black tarry stools', 'pale stools', 'yellow skin and eyes', 'no appetite', 'always hungry',
    'losing weight without trying', 'gaining weight fast', 'full after a few bites',
    'painful bowel movements', 'itchy bottom', 'stomach pain after eating',
    # urinary and reproductive
    'burning when peeing', 'peeing a lot', 'getting up at night to pee', 'blood in urine', 'dark urine',
    'cannot hold my urine', 'leaking urine when coughing', 'weak urine stream', 'kidney pain',
    'painful periods', 'heavy periods', 'missed period', 'spotting between periods', 'hot flashes',
    'night sweats', 'vaginal discharge', 'pain during sex', 'trouble getting pregnant', 'breast lump',
    'nipple discharge', 'swollen testicle', 'erection problems',
    # skin, hair, nails
    'itchy rash', 'red blotchy skin', 'hives', 'skin peeling', 'dry cracked skin', 'butterfly rash on face',
    'mole changing shape', 'bruise easily', 'tiny red spots on skin', 'skin turning pale', 'bluish lips',
    'hair falling out', 'bald patches', 'brittle nails', 'yellow toenails', 'sweating too much',
    'acne', 'blisters', 'cold sores', 'wound not healing', 'itching all over', 'skin darker in folds',
    # muscles, bones, joints
    'back pain', 'lower back pain shooting down leg', 'neck pain', 'stiff joints in the morning',
    'swollen knee', 'knee gives way', 'hip pain', 'painful big toe', 'aching muscles', 'muscle cramps',
    'muscle weakness', 'shoulder pain when lifting arm', 'wrist pain', 'hand pain and numbness at night',
    'heel pain in the morning', 'joints crack and hurt', 'broken bones easily', 'short for age',
    'curved spine', 'flat feet', 'joint too flexible', 'jaw clicking',
    # whole body and general
    'tired all the time', 'no energy', 'fever', 'chills', 'fever that comes and goes', 'feeling weak',
    'always thirsty', 'always cold', 'always hot', 'swollen face', 'puffy eyes in the morning',
    'frequent infections', 'slow healing', 'feeling unwell', 'lumps under the skin', 'enlarged lymph nodes',
    # mind and mood
    'feeling down', 'anxious all the time', 'panic attacks', 'mood swings', 'hearing voices',
    'seeing things that are not there', 'cannot concentrate', 'forgetful', 'lost interest in things',
    'thoughts of self harm', 'irritable', 'trouble remembering names',
    # children and development
    'baby not gaining weight', 'delayed walking', 'late to talk', 'poor eye contact', 'floppy baby',
    'big head', 'small head', 'child not growing', 'bedwetting', 'early puberty', 'learning difficulties',
    'repetitive movements', 'toe walking', 'squint in child', 'baby yellow skin', 'feeding problems in baby',
    'seizures in infancy', 'webbed neck', 'extra fingers', 'cleft lip', 'hearing loss in child',
    'unusual facial features',
)
